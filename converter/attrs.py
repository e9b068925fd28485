"""Chakra attributes: the oneof each consumer reads, and conversions to and from Python values."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the classes load protobuf, which writing nodes does not need (schema/)
    from .schema import AttributeProto, Node

# The oneof that consumers read for each well-known attribute (formats.md, section 1). A value
# in another oneof is silently ignored or rejected by some consumer.
CONSUMER_ONEOF: dict[str, str] = {
    "is_cpu_op": "bool_val",
    "num_ops": "int64_val",
    "tensor_size": "uint64_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "comm_priority": "int32_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "pg_name": "string_val",
    "involved_dim": "bool_list",
}

INTEGER_ONEOFS = frozenset({
    "int32_val", "int64_val", "uint32_val", "uint64_val", "sint32_val", "sint64_val",
    "fixed32_val", "fixed64_val", "sfixed32_val", "sfixed64_val",
})


def oneof_of(attr: AttributeProto) -> str | None:
    """Which value field is set, or None for an attribute without a known value."""
    return attr.WhichOneof("value")


def value_of(attr: AttributeProto) -> object:
    """The attribute's value as a Python object (lists for the *_list oneofs)."""
    which = attr.WhichOneof("value")
    if which is None:
        return None
    value = getattr(attr, which)
    return list(value.values) if which.endswith("_list") else value


def attr_dict(node: Node) -> dict[str, AttributeProto]:
    """The node's attributes by name (the last one wins, as in the consumers' lookups)."""
    return {attr.name: attr for attr in node.attr}


def oneof_for(name: str, value: object) -> str:
    """The oneof an attribute is written in: the one consumers read for ``name``, else by type.

    bool -> bool_val, int -> int64_val, float -> double_val, str -> string_val, and lists of
    those to the matching *_list. Lists are typed by their first element (empty: int64_list).
    """
    return CONSUMER_ONEOF.get(name) or _oneof_for(value)


def make_attr(name: str, value: object) -> AttributeProto:
    """A standalone attribute (see ``oneof_for``)."""
    from .schema import AttributeProto

    attr = AttributeProto(name=name)
    _set_value(attr, oneof_for(name, value), value)
    return attr


def _set_value(attr: AttributeProto, field: str, value: object) -> None:
    if field.endswith("_list"):
        getattr(attr, field).values.extend(value)  # type: ignore[arg-type]
    else:
        setattr(attr, field, value)


def _oneof_for(value: object) -> str:
    if isinstance(value, bool):
        return "bool_val"
    if isinstance(value, int):
        return "int64_val"
    if isinstance(value, float):
        return "double_val"
    if isinstance(value, str):
        return "string_val"
    if isinstance(value, (list, tuple)):
        first = value[0] if value else 0
        return _oneof_for(first).replace("_val", "_list")
    raise TypeError(f"no Chakra attribute type for {type(value).__name__} value {value!r}")
