"""Chakra ET protobuf classes (our own wire-compatible definition, see et_def.proto).

The classes load protobuf (about 40 ms, at every start of a process) and are imported on first
use: ``convert`` writes its bytes itself (converter/wire.py) and needs only the numbers and
names below, so neither it nor the workers it starts load protobuf. They are et_def.proto's
enums, which tests/converter/test_schema.py holds them to.
"""

from __future__ import annotations

import importlib

_MESSAGES = frozenset(("AttributeProto", "CollectiveCommType", "GlobalMetadata", "IOInfo", "Node",
                       "NodeStream", "NodeType"))

# NodeType's names, by value.
NODE_TYPE_NAMES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE",
                   "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")
# CollectiveCommType's names, by value.
COMM_TYPE_NAMES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST",
                   "ALL_TO_ALL", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")

# The node types the converter's checks and summaries single out.
METADATA = NODE_TYPE_NAMES.index("METADATA_NODE")
COMP = NODE_TYPE_NAMES.index("COMP_NODE")
COMM_COLL = NODE_TYPE_NAMES.index("COMM_COLL_NODE")
COMM_SEND = NODE_TYPE_NAMES.index("COMM_SEND_NODE")
COMM_RECV = NODE_TYPE_NAMES.index("COMM_RECV_NODE")
COMM_TYPES = frozenset({COMM_COLL, COMM_SEND, COMM_RECV})
MEM_LOAD = NODE_TYPE_NAMES.index("MEM_LOAD_NODE")
MEM_STORE = NODE_TYPE_NAMES.index("MEM_STORE_NODE")
KNOWN_TYPES = frozenset(range(len(NODE_TYPE_NAMES)))

__all__ = sorted(_MESSAGES) + [
    "NODE_TYPE_NAMES", "COMM_TYPE_NAMES", "METADATA", "COMP", "COMM_COLL", "COMM_SEND", "COMM_RECV",
    "COMM_TYPES", "MEM_LOAD", "MEM_STORE", "KNOWN_TYPES"]


def __getattr__(name: str) -> object:
    """The protobuf classes, loaded on first use (PEP 562)."""
    if name in _MESSAGES:
        value = getattr(importlib.import_module(f"{__name__}.et_def_pb2"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
