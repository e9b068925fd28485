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

from collections.abc import Sequence
from struct import Struct

from .attrs import make_attr, oneof_for

try:  # read by Cython when it compiles this module (setup.py): see _extend
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

if not cython.compiled:
    # Appends bytes to a node's bytearray: `+=` as a function, as cheap as `+=` itself in plain
    # Python. The compiled build has its own (wire.pxd), a resize and a copy, where `+=` goes
    # through the buffer protocol (about 380 instructions).
    from operator import iadd as _extend

    # Appends one byte to a node's bytearray. The compiled build has its own (wire.pxd), which
    # keeps the room a node's buffer starts with.
    _put_byte = bytearray.append

# Node fields (converter/schema/et_def.proto): key bytes = varint(field number << 3 | wire type).
_ID, _NAME, _TYPE = b"\x08", b"\x12", b"\x18"
_CTRL_DEPS, _DATA_DEPS = b"\x22", b"\x2a"  # packed
_START, _DURATION = b"\x30", b"\x38"
_INPUTS, _OUTPUTS, _ATTR = b"\x42", b"\x4a", b"\x52"
_IO_VALUES, _IO_SHAPES, _IO_TYPES = b"\x0a", b"\x12", b"\x1a"
# The one-byte keys written into every node, as the byte's value: appending a byte to the
# node's bytearray costs a fraction of adding a bytes object to it in the compiled build.
_ID_KEY, _START_KEY, _DURATION_KEY, _ATTR_KEY = _ID[0], _START[0], _DURATION[0], _ATTR[0]
_CTRL_KEY, _DATA_KEY, _INPUTS_KEY, _OUTPUTS_KEY = (
    _CTRL_DEPS[0], _DATA_DEPS[0], _INPUTS[0], _OUTPUTS[0])
_IO_VALUES_KEY, _IO_SHAPES_KEY, _IO_TYPES_KEY = _IO_VALUES[0], _IO_SHAPES[0], _IO_TYPES[0]
_ATTR_NAME = b"\x0a"
_META_VERSION, _META_ATTR = b"\x0a", b"\x12"  # GlobalMetadata fields

# AttributeProto value oneofs written here: key bytes and how the value is encoded.
_SCALAR_KEYS = {
    "double_val": b"\x19", "int32_val": b"\x38", "int64_val": b"\x48", "uint64_val": b"\x68",
    "bool_val": b"\xd8\x01", "string_val": b"\xea\x01",
}
_DOUBLE = Struct("<d").pack
# AttributeProto list oneofs written here (the ones attrs.oneof_for picks for a list): key
# bytes, and the one type their elements must have (any other list is protobuf's to write).
_LIST_KEYS = {"int64_list": (b"\x52", int), "double_list": (b"\x22", float),
              "bool_list": (b"\xe2\x01", bool), "string_list": (b"\xf2\x01", str)}
_LIST_VALUES = b"\x0a"  # the XList message's one field, ``values``
_TIMING_NAMES = {unit: (f"start_{unit}", f"duration_{unit}") for unit in ("ns", "ps")}
_U64 = 1 << 64
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

# Varints below this value are looked up instead of encoded in Python.
_VARINT_CACHE_SIZE = 1 << 14

# Built without a call per entry: they are made at import, i.e. on every start of the CLI.
_VARINTS = [bytes((n,)) for n in range(0x80)] + [
    bytes(((n & 0x7F) | 0x80, n >> 7)) for n in range(0x80, _VARINT_CACHE_SIZE)]
if not cython.compiled:
    # Plain Python writes a long varint 14 bits a step: two bytes, each with its continuation
    # bit, per step (a node's times take 6-9 bytes), where a byte a step cost twice the calls.
    # The compiled build writes varints in C (wire.pxd: _append_varint).
    _VARINT_PAIRS = [bytes(((n & 0x7F) | 0x80, (n >> 7) | 0x80))
                     for n in range(_VARINT_CACHE_SIZE)]


def encode_varint(value: int) -> bytes:
    """The protobuf base-128 varint encoding of an integer in [0, 2**64)."""
    if 0 <= value < _VARINT_CACHE_SIZE:
        return _VARINTS[value]
    buf = bytearray()
    _put_varint(buf, value)
    return bytes(buf)


def _put_varint(buf: bytearray, value: int) -> None:
    """Append the varint of an integer in [0, 2**64) to ``buf``."""
    if 0 <= value <= 0x7F:  # one byte (most lengths and dependency ids of small graphs)
        _put_byte(buf, value)
        return
    if value < 0 or value >= _U64:  # protobuf's unsigned fields refuse these too
        raise ValueError(f"value {value} out of range for a varint")
    bits = value  # a C unsigned 64-bit integer in the compiled build (wire.pxd)
    if cython.compiled:  # written into the buffer in one step (wire.pxd: _append_varint)
        _append_varint(buf, bits)
    else:
        while bits >= _VARINT_CACHE_SIZE:
            _extend(buf, _VARINT_PAIRS[bits & 0x3FFF])
            bits >>= 14
        _extend(buf, _VARINTS[bits])


def _varint_size(value: int) -> int:
    """Bytes in the varint of an integer in [0, 2**64) (callers check the range)."""
    if not cython.compiled:  # one call where the loop below is a step per 7 bits
        return (value.bit_length() + 6) // 7 or 1
    size = 1
    while value > 0x7F:
        value >>= 7
        size += 1
    return size


def _put_packed(buf: bytearray, key: int, values: Sequence[int]) -> None:
    """A packed repeated varint field (its one-byte key, byte length, the varints)."""
    size = 0
    for value in values:
        if value < 0 or value >= _U64:
            raise ValueError(f"value {value} out of range for a varint")
        size += _varint_size(value)
    _put_byte(buf, key)
    _put_varint(buf, size)
    for value in values:
        _put_varint(buf, value)


if not cython.compiled:
    # What the node writer calls: the compiled build has its own (wire.pxd), which checks an
    # int's range by converting it to a C integer where these compare it with 0 and 2**64.
    _varint, _packed = _put_varint, _put_packed


def _put_bytes(buf: bytearray, key: int, data: bytes) -> None:
    """A length-delimited field: its one-byte key, byte length, the bytes."""
    _put_byte(buf, key)
    _put_varint(buf, len(data))
    _extend(buf, data)


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
        field = _list_field(oneof, value)
        if field is None:  # the rarer oneofs, and lists of mixed or out-of-range values
            return make_attr(name, value).SerializeToString()
        return _attr_name(name) + field
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


def _list_field(oneof: str, values: object) -> bytes | None:
    """The list oneof's field (key, length, the XList message: packed numbers, or strings),
    or None where every element is not of the list's type (or an int is beyond int64)."""
    found = _LIST_KEYS.get(oneof)
    if found is None or type(values) not in (list, tuple):
        return None
    key, kind = found
    for item in values:  # type: ignore[attr-defined]
        if type(item) is not kind or kind is int and not _I64_MIN <= item <= _I64_MAX:
            return None
    if kind is str:
        body = b"".join(_length_delimited(_LIST_VALUES, item.encode()) for item in values)  # type: ignore[attr-defined]
    elif not values:
        body = b""
    elif kind is float:
        body = _length_delimited(_LIST_VALUES, Struct(f"<{len(values)}d").pack(*values))  # type: ignore[arg-type]
    elif kind is bool:
        body = _length_delimited(_LIST_VALUES, bytes(values))  # type: ignore[arg-type]
    else:
        body = _length_delimited(_LIST_VALUES, b"".join(
            _int_value(item, "int64_val") for item in values))  # type: ignore[attr-defined]
    return _length_delimited(key, body)


def _int_value(value: int, oneof: str) -> bytes:
    """An int64_val / uint64_val value's varint."""
    return encode_varint(_int_bits(value, oneof))


def _int_bits(value: int, oneof: str) -> int:
    """What an int64_val / uint64_val value is written as (an int64's negative values as their
    64-bit two's complement); out of its range is refused, as protobuf does."""
    if 0 <= value <= 9_223_372_036_854_775_807:  # _I64_MAX (compiled, a literal is compared
        return value  # with an int without a lookup nor an int object)
    if oneof == "int64_val" and _I64_MIN <= value < 0:
        return value + _U64
    if oneof == "uint64_val" and 0 <= value < _U64:
        return value
    raise ValueError(f"value {value} out of range for {oneof}")


def encode_metadata(version: str, values: dict[str, object]) -> bytes:
    """A GlobalMetadata message (the ET's first): ``version`` and one attribute per item of
    ``values`` (None values left out), each in the oneof ``encode_attr`` picks."""
    body = _length_delimited(_META_VERSION, version.encode()) if version else b""
    return body + b"".join(_length_delimited(_META_ATTR, encode_attr(name, value))
                           for name, value in values.items() if value is not None)


class NodeEncoder:
    """Writes Node message bodies into a ``bytearray`` given to each method (one per node), so
    that a node's fields are appended in place rather than joined from small pieces; caches
    what repeats within one graph.

    One encoder per graph: its caches (names, constant attributes) grow with the distinct
    values of that graph and go with it.
    """

    def __init__(self) -> None:
        self._names: dict[tuple[str, int], bytes] = {}
        self._attrs: dict[str, dict] = {}  # name -> str or bool value -> the whole attr field
        self._int_fields: dict[str, dict[str, tuple[bytes, ...]]] = {}  # see _int_prefixes
        self._oneofs: dict[str, dict[type, str]] = {}  # name -> value type -> oneof

    def name(self, name: str, node_type: int = 0) -> bytes:
        """The Node ``name`` and ``type`` fields (2 and 3), for :meth:`head`."""
        field = self._names.get((name, node_type))
        if field is None:
            field = (_length_delimited(_NAME, name.encode()) if name else b"") + (
                _TYPE + encode_varint(node_type) if node_type else b"")
            self._names[(name, node_type)] = field
        return field

    def head(self, buf: bytearray, node_id: int, name_field: bytes, ctrl_deps: list[int] | None,
             data_deps: list[int] | None, start_micros: int | None, duration_micros: int | None
             ) -> None:
        """Node fields 1-7, in field order (``name_field``: :meth:`name`); zero values are left
        out (proto3)."""
        if node_id:
            _put_byte(buf, _ID_KEY)
            _varint(buf, node_id)
        _extend(buf, name_field)
        if ctrl_deps:
            _packed(buf, _CTRL_KEY, ctrl_deps)
        if data_deps:
            _packed(buf, _DATA_KEY, data_deps)
        if start_micros:
            _put_byte(buf, _START_KEY)
            _varint(buf, start_micros)
        if duration_micros:
            _put_byte(buf, _DURATION_KEY)
            _varint(buf, duration_micros)

    def io(self, buf: bytearray, inputs: bool, values: str | bytes, shapes: str | bytes,
           types: str | bytes) -> None:
        """The Node ``inputs`` (or ``outputs``) field; written even when empty, as a set
        message field is. Each member is a str or its UTF-8 bytes."""
        value_bytes = values.encode() if type(values) is str else values
        shape_bytes = shapes.encode() if type(shapes) is str else shapes
        type_bytes = types.encode() if type(types) is str else types
        size = 0
        for data in (value_bytes, shape_bytes, type_bytes):
            if data:  # each member's key is one byte
                size += 1 + _varint_size(len(data)) + len(data)
        _put_byte(buf, _INPUTS_KEY if inputs else _OUTPUTS_KEY)
        _put_varint(buf, size)
        if value_bytes:
            _put_bytes(buf, _IO_VALUES_KEY, value_bytes)
        if shape_bytes:
            _put_bytes(buf, _IO_SHAPES_KEY, shape_bytes)
        if type_bytes:
            _put_bytes(buf, _IO_TYPES_KEY, type_bytes)

    def attr(self, buf: bytearray, name: str, value: object) -> None:
        """One Node ``attr`` field (key, length, AttributeProto); nothing for a None value."""
        if value is None:
            return
        kind = type(value)
        if kind is str or kind is bool:
            # The whole field, by name then value (no str equals a bool); two lookups cost
            # less than making and hashing a (name, value) key, once per attribute written.
            fields = self._attrs.get(name)
            if fields is None:
                fields = self._attrs[name] = {}
            field = fields.get(value)
            if field is None:
                field = fields[value] = _length_delimited(_ATTR, encode_attr(name, value))
            _extend(buf, field)
            return
        oneofs = self._oneofs.get(name)
        if oneofs is None:
            oneofs = self._oneofs[name] = {}
        oneof = oneofs.get(kind)
        if oneof is None:
            oneof = oneofs[kind] = oneof_for(name, value)
        if kind is int and oneof in ("int64_val", "uint64_val"):
            self.int_attr(buf, name, value, oneof)  # type: ignore[arg-type]
        else:
            _put_bytes(buf, _ATTR_KEY, encode_attr(name, value, oneof))

    def int_attr(self, buf: bytearray, name: str, value: int, oneof: str = "int64_val") -> None:
        """An int64 / uint64 attribute (the common timing and id attributes), without the
        general dispatch."""
        by_oneof = self._int_fields.get(name)  # by name then oneof: no tuple key per call
        if by_oneof is None:
            by_oneof = self._int_fields[name] = {}
        prefixes = by_oneof.get(oneof)
        if prefixes is None:
            prefixes = by_oneof[oneof] = _int_prefixes(name, oneof)
        _put_int_field(buf, prefixes, _int_bits(value, oneof))

    def timing(self, buf: bytearray, unit: str, start: int | None, duration: int | None) -> None:
        """The ``start_<unit>`` and ``duration_<unit>`` attributes (either may be None)."""
        start_prefixes, duration_prefixes = _TIMING_PREFIXES[unit]
        if start is not None:
            _put_int_field(buf, start_prefixes, _int_bits(start, "int64_val"))
        if duration is not None:
            _put_int_field(buf, duration_prefixes, _int_bits(duration, "int64_val"))


def _put_int_field(buf: bytearray, prefixes: tuple[bytes, ...], bits: int) -> None:
    """A Node ``attr`` field of an integer attribute: its prefix for the value's size
    (_int_prefixes) and the value as written (see _int_bits)."""
    _extend(buf, prefixes[_varint_size(bits)])
    if cython.compiled:  # bits: a C integer already (wire.pxd), in range (_int_bits)
        _append_varint(buf, bits)
    else:
        _put_varint(buf, bits)


def _int_prefixes(name: str, oneof: str) -> tuple[bytes, ...]:
    """An integer attribute's Node ``attr`` field up to its value (the field's key, its
    length, the AttributeProto's name and value key), by the size of the value's varint (1-10
    bytes; item 0 unused): the field's length depends on it, and a prefix per size is
    appended whole."""
    head = _attr_name(name) + _SCALAR_KEYS[oneof]
    return (b"",) + tuple(bytes((_ATTR_KEY,)) + encode_varint(len(head) + size) + head
                          for size in range(1, 11))


# The timing attributes' prefixes (_int_prefixes), per exact time unit.
_TIMING_PREFIXES = {unit: tuple(_int_prefixes(name, "int64_val") for name in names)
                    for unit, names in _TIMING_NAMES.items()}
