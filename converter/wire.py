"""Protobuf wire format for Chakra nodes, written directly.

Building a ``Node`` message field by field and serialising it costs ~10 us a node in protobuf's
Python API (one call per attribute, each making a message). The converter instead writes each
node's bytes itself: most pieces repeat from node to node (names, node types, lanes,
``is_cpu_op``, attribute names), so they are encoded once per graph and reused, and the rest are
varints. The bytes are exactly what protobuf writes for the same message (fields in number
order, proto3 defaults left out, packed repeated numbers); tests/converter/test_wire.py holds
this against protobuf's own serialiser. Attribute values outside the common scalars (lists)
are serialised by protobuf.
"""

from __future__ import annotations

from struct import Struct

from .attrs import make_attr, oneof_for

# Node fields (converter/schema/et_def.proto): key bytes = varint(field number << 3 | wire type).
_ID, _NAME, _TYPE = b"\x08", b"\x12", b"\x18"
_CTRL_DEPS, _DATA_DEPS = b"\x22", b"\x2a"  # packed
_START, _DURATION = b"\x30", b"\x38"
_INPUTS, _OUTPUTS, _ATTR = b"\x42", b"\x4a", b"\x52"
_IO_VALUES, _IO_SHAPES, _IO_TYPES = b"\x0a", b"\x12", b"\x1a"
_ATTR_NAME = b"\x0a"

# AttributeProto value oneofs written here: key bytes and how the value is encoded.
_SCALAR_KEYS = {
    "double_val": b"\x19", "int32_val": b"\x38", "int64_val": b"\x48", "uint64_val": b"\x68",
    "bool_val": b"\xd8\x01", "string_val": b"\xea\x01",
}
_DOUBLE = Struct("<d").pack
_TIMING_NAMES = {unit: (f"start_{unit}", f"duration_{unit}") for unit in ("ns", "ps")}
_U64 = 1 << 64
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

# Varints below this value are looked up instead of encoded in Python.
_VARINT_CACHE_SIZE = 1 << 14


def _encode_varint_loop(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Built without a call per entry: they are made at import, i.e. on every start of the CLI.
_VARINTS = [bytes((n,)) for n in range(0x80)] + [
    bytes(((n & 0x7F) | 0x80, n >> 7)) for n in range(0x80, _VARINT_CACHE_SIZE)]
# 14 low bits as the first two bytes of a longer varint (both with the continuation bit).
_LOW14 = [bytes(((n & 0x7F) | 0x80, (n >> 7) | 0x80)) for n in range(1 << 14)]
# Varint tails of values >> 28: timestamps, the common large values, share a few of them.
_HIGH_TAILS: dict[int, bytes] = {}


def encode_varint(value: int) -> bytes:
    """The protobuf base-128 varint encoding of an integer in [0, 2**64)."""
    if value < 0 or value >= _U64:  # protobuf's unsigned fields refuse these too
        raise ValueError(f"value {value} out of range for a varint")
    if value < _VARINT_CACHE_SIZE:
        return _VARINTS[value]
    if value < 1 << 28:
        return _LOW14[value & 0x3FFF] + _VARINTS[value >> 14]
    high = value >> 28
    tail = _HIGH_TAILS.get(high)
    if tail is None:
        if len(_HIGH_TAILS) > 1 << 16:
            _HIGH_TAILS.clear()
        tail = _HIGH_TAILS[high] = _encode_varint_loop(high)
    return _LOW14[value & 0x3FFF] + _LOW14[(value >> 14) & 0x3FFF] + tail


def _signed_varint(value: int, low: int, high: int, oneof: str) -> bytes:
    """int32 / int64: negative values are written as their 64-bit two's complement."""
    if not low <= value <= high:
        raise ValueError(f"value {value} out of range for {oneof}")
    return encode_varint(value + _U64 if value < 0 else value)


def _length_delimited(key: bytes, body: bytes) -> bytes:
    return key + encode_varint(len(body)) + body


def _attr_name(name: str) -> bytes:
    """AttributeProto's ``name`` field (left out when empty, as proto3 does)."""
    return _length_delimited(_ATTR_NAME, name.encode()) if name else b""


def encode_attr(name: str, value: object, oneof: str | None = None) -> bytes:
    """One AttributeProto (without the Node field key), value in ``oneof`` (default: the one
    attrs.oneof_for picks, as consumers read it)."""
    if oneof is None:
        oneof = oneof_for(name, value)
    key = _SCALAR_KEYS.get(oneof)
    if key is None or type(value) is float and oneof != "double_val":
        return make_attr(name, value).SerializeToString()  # lists and the rarer oneofs
    head = _attr_name(name)
    if oneof == "string_val":
        return head + _length_delimited(key, value.encode())  # type: ignore[union-attr]
    if oneof == "double_val":
        return head + key + _DOUBLE(value)
    if oneof == "bool_val":
        return head + key + (b"\x01" if value else b"\x00")
    if oneof == "int32_val":
        return head + key + _signed_varint(value, _I32_MIN, _I32_MAX, oneof)  # type: ignore[arg-type]
    return head + key + _int_value(value, oneof)  # type: ignore[arg-type]


def _int_value(value: int, oneof: str) -> bytes:
    """An int64_val / uint64_val value's varint; out of its range is refused, as protobuf does."""
    if 0 <= value <= _I64_MAX:
        return encode_varint(value)
    if oneof == "int64_val":
        return _signed_varint(value, _I64_MIN, _I64_MAX, oneof)
    if oneof == "uint64_val" and 0 <= value < _U64:
        return encode_varint(value)
    raise ValueError(f"value {value} out of range for {oneof}")


def _int_field(head: bytes, value: int, oneof: str) -> bytes:
    """A Node ``attr`` field: ``head`` (the attribute's name and value key) + ``value``."""
    return _length_delimited(_ATTR, head + _int_value(value, oneof))


class NodeEncoder:
    """Writes Node message bodies; caches what repeats within one graph.

    One encoder per graph: its caches (names, constant attributes) grow with the distinct
    values of that graph and go with it.
    """

    def __init__(self) -> None:
        self._names: dict[tuple[str, int], bytes] = {}
        self._attrs: dict[tuple, bytes] = {}  # (name, value, oneof) -> the whole attr field
        self._int_heads: dict[tuple[str, str], bytes] = {}  # (name, oneof) -> field up to the value
        self._oneofs: dict[tuple[str, type], str] = {}

    def name(self, name: str, node_type: int = 0) -> bytes:
        """The Node ``name`` and ``type`` fields (2 and 3)."""
        field = self._names.get((name, node_type))
        if field is None:
            field = (_length_delimited(_NAME, name.encode()) if name else b"") + (
                _TYPE + encode_varint(node_type) if node_type else b"")
            self._names[(name, node_type)] = field
        return field

    def timing(self, unit: str, start: int | None, duration: int | None) -> bytes:
        """The ``start_<unit>`` and ``duration_<unit>`` attributes (either may be None)."""
        start_name, duration_name = _TIMING_NAMES[unit]
        out = b"" if start is None else self.int_attr(start_name, start)
        return out if duration is None else out + self.int_attr(duration_name, duration)

    def attr(self, name: str, value: object) -> bytes:
        """One Node ``attr`` field (key, length, AttributeProto); b"" for a None value."""
        if value is None:
            return b""
        kind = type(value)
        oneof = self._oneofs.get((name, kind))
        if oneof is None:
            oneof = self._oneofs[(name, kind)] = oneof_for(name, value)
        if kind is int and oneof in ("int64_val", "uint64_val"):
            return self.int_attr(name, value, oneof)  # type: ignore[arg-type]
        if kind is str or kind is bool:
            cache_key = (name, value, oneof)
            field = self._attrs.get(cache_key)
            if field is None:
                field = self._attrs[cache_key] = _length_delimited(_ATTR, encode_attr(name, value, oneof))
            return field
        return _length_delimited(_ATTR, encode_attr(name, value, oneof))

    def int_attr(self, name: str, value: int, oneof: str = "int64_val") -> bytes:
        """An int64 / uint64 attribute (the common timing and id attributes), without the
        general dispatch."""
        head = self._int_heads.get((name, oneof))
        if head is None:
            head = self._int_heads[(name, oneof)] = _attr_name(name) + _SCALAR_KEYS[oneof]
        return _int_field(head, value, oneof)

    def io(self, inputs: bool, values: str, shapes: str, types: str) -> bytes:
        """The Node ``inputs`` (or ``outputs``) field; written even when empty, as a set
        message field is."""
        body = b""
        if values:
            body += _length_delimited(_IO_VALUES, values.encode())
        if shapes:
            body += _length_delimited(_IO_SHAPES, shapes.encode())
        if types:
            body += _length_delimited(_IO_TYPES, types.encode())
        return _length_delimited(_INPUTS if inputs else _OUTPUTS, body)

    def head(self, node_id: int, name_field: bytes, ctrl_deps: list[int] | None,
             data_deps: list[int] | None, start_micros: int | None, duration_micros: int | None
             ) -> bytes:
        """Node fields 1-7, in field order (``name_field``: :meth:`name`); zero values are left
        out (proto3)."""
        out = _ID + encode_varint(node_id) + name_field if node_id else name_field
        if ctrl_deps:
            out += _length_delimited(_CTRL_DEPS, b"".join(map(encode_varint, ctrl_deps)))
        if data_deps:
            out += _length_delimited(_DATA_DEPS, b"".join(map(encode_varint, data_deps)))
        if start_micros:
            out += _START + encode_varint(start_micros)
        if duration_micros:
            out += _DURATION + encode_varint(duration_micros)
        return out
