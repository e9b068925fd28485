"""converter/schema states the enums' numbers and names without loading protobuf; they are
et_def.proto's (read here through protobuf's own classes)."""

from __future__ import annotations

from chakra_hooks.converter import schema


def test_node_types_are_the_protos() -> None:
    node_type = schema.NodeType
    assert schema.NODE_TYPE_NAMES == tuple(node_type.Name(v) for v in sorted(node_type.values()))
    assert sorted(node_type.values()) == list(range(len(schema.NODE_TYPE_NAMES)))
    assert schema.KNOWN_TYPES == frozenset(node_type.values())
    for constant, name in (("METADATA", "METADATA_NODE"), ("COMP", "COMP_NODE"),
                           ("COMM_COLL", "COMM_COLL_NODE"), ("COMM_SEND", "COMM_SEND_NODE"),
                           ("COMM_RECV", "COMM_RECV_NODE"), ("MEM_LOAD", "MEM_LOAD_NODE"),
                           ("MEM_STORE", "MEM_STORE_NODE")):
        assert getattr(schema, constant) == node_type.Value(name)


def test_collective_types_are_the_protos() -> None:
    comm = schema.CollectiveCommType
    assert schema.COMM_TYPE_NAMES == tuple(comm.Name(v) for v in sorted(comm.values()))
    assert sorted(comm.values()) == list(range(len(schema.COMM_TYPE_NAMES)))
