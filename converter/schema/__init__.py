"""Chakra ET protobuf classes (our own wire-compatible definition, see et_def.proto)."""

from .et_def_pb2 import (  # noqa: F401
    AttributeProto,
    CollectiveCommType,
    GlobalMetadata,
    IOInfo,
    Node,
    NodeStream,
    NodeType,
)

# The node types the converter's checks and summaries single out (values from et_def.proto).
COMP = NodeType.Value("COMP_NODE")
COMM_COLL = NodeType.Value("COMM_COLL_NODE")
COMM_SEND = NodeType.Value("COMM_SEND_NODE")
COMM_RECV = NodeType.Value("COMM_RECV_NODE")
COMM_TYPES = frozenset({COMM_COLL, COMM_SEND, COMM_RECV})
MEM_LOAD = NodeType.Value("MEM_LOAD_NODE")
MEM_STORE = NodeType.Value("MEM_STORE_NODE")
KNOWN_TYPES = frozenset(NodeType.values())
