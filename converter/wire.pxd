# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the encoder's helpers become direct C calls, which is most of what writing a node costs, and
# varints are written into the node's bytearray by a loop over a C integer.
cimport cython
from cpython.bytearray cimport (PyByteArray_AS_STRING, PyByteArray_FromStringAndSize,
                                PyByteArray_GET_SIZE, PyByteArray_Resize)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy


# bytes appended to a node's bytearray by a resize and a copy (wire.py's _extend)
cdef inline int _extend(bytearray buf, bytes data) except -1:
    if buf is None or data is None:
        raise TypeError("_extend takes a bytearray and bytes")
    cdef Py_ssize_t at = PyByteArray_GET_SIZE(buf)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    PyByteArray_Resize(buf, at + size)
    memcpy(PyByteArray_AS_STRING(buf) + at, PyBytes_AS_STRING(data), size)
    return 0


# a varint of two bytes or more written into a node's bytearray in one step, where appending
# byte by byte resized it for each (wire.py's _put_varint)
cdef inline int _append_varint(bytearray buf, unsigned long long bits) except -1:
    if buf is None:
        raise TypeError("_append_varint takes a bytearray")
    cdef Py_ssize_t at = PyByteArray_GET_SIZE(buf)
    cdef Py_ssize_t size = 1
    cdef unsigned long long rest = bits >> 7
    while rest:
        size += 1
        rest >>= 7
    PyByteArray_Resize(buf, at + size)
    cdef unsigned char* out = <unsigned char*>PyByteArray_AS_STRING(buf) + at
    while bits > 0x7F:
        out[0] = <unsigned char>((bits & 0x7F) | 0x80)
        out += 1
        bits >>= 7
    out[0] = <unsigned char>bits
    return 0

cpdef bytes encode_varint(object value)


@cython.locals(bits=cython.ulonglong)
cpdef _put_varint(bytearray buf, object value)


@cython.locals(size=cython.int)
cpdef int _varint_size(unsigned long long value)


@cython.locals(size=Py_ssize_t)
cpdef _put_packed(bytearray buf, int key, object values)
cpdef _put_bytes(bytearray buf, int key, bytes data)
cpdef _put_int_field(bytearray buf, tuple prefixes, object bits)
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
    cpdef int_attr(self, bytearray buf, str name, object value, str oneof=*)
    cpdef timing(self, bytearray buf, str unit, object start, object duration)


# a node's empty buffer, and its bytes once written (converter/graph.py's _make_node)
cdef inline bytearray _new_buffer():
    return PyByteArray_FromStringAndSize(NULL, 0)


cdef inline bytes _buffer_bytes(bytearray buf):
    if buf is None:
        raise TypeError("_buffer_bytes takes a bytearray")
    return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(buf), PyByteArray_GET_SIZE(buf))
