# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the encoder's helpers become direct C calls, which is most of what writing a node costs, and
# varints are written into the node's bytearray by a loop over a C integer.
cimport cython
from cpython.bytearray cimport (PyByteArray_AS_STRING, PyByteArray_FromStringAndSize,
                                PyByteArray_GET_SIZE, PyByteArray_Resize)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy


cdef extern from "Python.h":
    # The bytearray's layout (CPython's cpython/bytearrayobject.h): what _grow reads.
    ctypedef struct PyByteArrayObject:
        Py_ssize_t ob_alloc
        char* ob_bytes
        char* ob_start
        Py_ssize_t ob_exports
    void Py_SET_SIZE(object, Py_ssize_t)


# Where ``size`` more bytes go at the end of ``buf``, grown by that much. Within the room the
# buffer already has, the size is set as PyByteArray_Resize's own quick path sets it; beyond
# it, or with a buffer exported (a memoryview alive, which PyByteArray_Resize refuses), the
# resize is PyByteArray_Resize's. Every write to a node's buffer goes through here: a node's
# buffer starts with room (_new_buffer), and PyByteArray_Resize would give that back at the
# first small write (it reallocates whenever the new size is under half the room).
cdef inline char* _grow(bytearray buf, Py_ssize_t size) except NULL:
    if buf is None:
        raise TypeError("_grow takes a bytearray")
    cdef PyByteArrayObject* raw = <PyByteArrayObject*>buf
    cdef Py_ssize_t at = PyByteArray_GET_SIZE(buf)
    if raw.ob_exports == 0 and raw.ob_start == raw.ob_bytes and at + size < raw.ob_alloc:
        Py_SET_SIZE(buf, at + size)
        raw.ob_start[at + size] = 0  # the trailing NUL a bytearray keeps
    elif PyByteArray_Resize(buf, at + size) < 0:
        return NULL
    return PyByteArray_AS_STRING(buf) + at


# one byte appended to a node's bytearray (wire.py's _put_byte: bytearray.append)
cdef inline int _put_byte(bytearray buf, int value) except -1:
    if value < 0 or value > 255:
        raise ValueError("byte must be in range(0, 256)")
    _grow(buf, 1)[0] = <char>value
    return 0


# bytes appended to a node's bytearray by a resize and a copy (wire.py's _extend)
cdef inline int _extend(bytearray buf, bytes data) except -1:
    if data is None:
        raise TypeError("_extend takes a bytearray and bytes")
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    memcpy(_grow(buf, size), PyBytes_AS_STRING(data), size)
    return 0


# a varint of two bytes or more written into a node's bytearray in one step, where appending
# byte by byte resized it for each (wire.py's _put_varint)
cdef inline int _append_varint(bytearray buf, unsigned long long bits) except -1:
    cdef Py_ssize_t size = 1
    cdef unsigned long long rest = bits >> 7
    while rest:
        size += 1
        rest >>= 7
    cdef unsigned char* out = <unsigned char*>_grow(buf, size)
    while bits > 0x7F:
        out[0] = <unsigned char>((bits & 0x7F) | 0x80)
        out += 1
        bits >>= 7
    out[0] = <unsigned char>bits
    return 0

# an int (exactly) as a varint's value, its range checked by Cython's own conversion (fast
# paths for ints of one or two digits): a negative or 2**64 and up is refused as wire.py's
# _put_varint refuses it (ValueError), where comparing the int with 0 and 2**64 cost two
# Python comparisons
cdef inline unsigned long long _u64(object value) except? 0xFFFFFFFFFFFFFFFF:
    cdef unsigned long long bits
    try:
        bits = value
    except OverflowError:
        raise ValueError(f"value {value} out of range for a varint") from None
    return bits


cpdef bytes encode_varint(object value)


@cython.locals(bits=cython.ulonglong)
cpdef _put_varint(bytearray buf, object value)


@cython.locals(size=cython.int)
cpdef int _varint_size(unsigned long long value)


@cython.locals(size=Py_ssize_t)
cpdef _put_packed(bytearray buf, int key, object values)
cpdef _put_bytes(bytearray buf, int key, bytes data)


# The node writer's varints (NodeEncoder.head): an int's range checked by converting it to a
# C integer (_u64), where _put_varint and _put_packed compare it with 0 and 2**64 (two Python
# comparisons); anything but an int goes to them.
cdef inline int _varint(bytearray buf, object value) except -1:
    if type(value) is int:
        _append_varint(buf, _u64(value))
    else:
        _put_varint(buf, value)
    return 0


cdef inline int _packed(bytearray buf, int key, object values) except -1:
    cdef Py_ssize_t size = 0
    for value in values:
        if type(value) is not int:
            _put_packed(buf, key, values)
            return 0
        size += _varint_size(_u64(value))
    _put_byte(buf, key)
    _append_varint(buf, size)
    for value in values:
        _append_varint(buf, _u64(value))
    return 0


# A packed repeated field of one or two varints (``count``: 0-2; nothing for 0): a node's
# dependencies as graph.py's compiled node writer holds them, on C integers (wire.py's
# _put_packed, for lists, writes the same bytes).
cdef inline int _packed_pair(bytearray buf, int key, int count, unsigned long long first,
                             unsigned long long second) except -1:
    if count == 0:
        return 0
    cdef Py_ssize_t size = _varint_size(first)
    if count == 2:
        size += _varint_size(second)
    _put_byte(buf, key)
    _append_varint(buf, size)
    _append_varint(buf, first)
    if count == 2:
        _append_varint(buf, second)
    return 0


# An IOInfo member's bytes in the message (its one-byte key, length, bytes; none if empty).
cdef inline Py_ssize_t _member_size(bytes data):
    cdef Py_ssize_t length = PyBytes_GET_SIZE(data)
    return 1 + _varint_size(length) + length if length else 0


cdef inline int _put_member(bytearray buf, int key, bytes data) except -1:
    cdef Py_ssize_t length = PyBytes_GET_SIZE(data)
    if length:
        _put_byte(buf, key)
        _append_varint(buf, length)
        memcpy(_grow(buf, length), PyBytes_AS_STRING(data), length)
    return 0


# The Node ``inputs`` / ``outputs`` field (``key``) of three bytes members, as
# NodeEncoder.io writes it; False, writing nothing, where a member is not bytes.
cdef inline bint _io_bytes(bytearray buf, int key, object values, object shapes,
                           object types) except -1:
    if type(values) is not bytes or type(shapes) is not bytes or type(types) is not bytes:
        return False
    _put_byte(buf, key)
    _append_varint(buf, _member_size(values) + _member_size(shapes) + _member_size(types))
    _put_member(buf, 0x0a, values)
    _put_member(buf, 0x12, shapes)
    _put_member(buf, 0x1a, types)
    return True



cpdef _put_int_field(bytearray buf, tuple prefixes, unsigned long long bits)


# _put_int_field inline, for graph.py's compiled node writer (three to five a node)
cdef inline int _int_field(bytearray buf, tuple prefixes, unsigned long long bits) except -1:
    _extend(buf, prefixes[_varint_size(bits)])
    _append_varint(buf, bits)
    return 0
cpdef bytes _signed_varint(object value, object low, object high, str oneof)
cpdef bytes _length_delimited(bytes key, bytes body)
cpdef bytes _attr_name(str name)
cpdef bytes encode_attr(str name, object value, str oneof=*)
cpdef bytes _int_value(object value, str oneof)
cpdef object _int_bits(object value, str oneof)


cdef class NodeEncoder:
    cdef dict _names, _attrs, _int_fields, _oneofs
    cpdef bytes name(self, str name, object node_type=*)
    cpdef head(self, bytearray buf, object node_id, bytes name_field, object ctrl_deps,
               object data_deps, object start_micros, object duration_micros)
    @cython.locals(value_bytes=bytes, shape_bytes=bytes, type_bytes=bytes, size=Py_ssize_t)
    cpdef io(self, bytearray buf, bint inputs, object values, object shapes, object types)
    @cython.locals(fields=dict, oneofs=dict)
    cpdef attr(self, bytearray buf, str name, object value)
    @cython.locals(by_oneof=dict)
    cpdef int_attr(self, bytearray buf, str name, object value, str oneof=*)
    cpdef timing(self, bytearray buf, str unit, object start, object duration)


# a node's empty buffer, and its bytes once written (converter/graph.py's _make_node)
# (room for a node of up to 255 bytes: most nodes then grow without a reallocation)
cdef inline bytearray _new_buffer():
    cdef bytearray buf = PyByteArray_FromStringAndSize(NULL, 255)
    Py_SET_SIZE(buf, 0)
    PyByteArray_AS_STRING(buf)[0] = 0
    return buf


cdef inline bytes _buffer_bytes(bytearray buf):
    if buf is None:
        raise TypeError("_buffer_bytes takes a bytearray")
    return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(buf), PyByteArray_GET_SIZE(buf))
