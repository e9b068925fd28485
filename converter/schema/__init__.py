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
