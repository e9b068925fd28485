# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the encoder's helpers become direct C calls, which is most of what writing a node costs.
cpdef bytes encode_varint(object value)
cpdef bytes _signed_varint(object value, object low, object high, str oneof)
cpdef bytes _length_delimited(bytes key, bytes body)
cpdef bytes _attr_name(str name)
cpdef bytes encode_attr(str name, object value, str oneof=*)
cpdef bytes _int_value(object value, str oneof)
cpdef bytes _int_field(bytes head, object value, str oneof)


cdef class NodeEncoder:
    cdef dict _names, _attrs, _int_heads, _oneofs
    cpdef bytes name(self, str name, object node_type=*)
    cpdef bytes timing(self, str unit, object start, object duration)
    cpdef bytes attr(self, str name, object value)
    cpdef bytes int_attr(self, str name, object value, str oneof=*)
    cpdef bytes io(self, bint inputs, str values, str shapes, str types)
    cpdef bytes head(self, object node_id, bytes name_field, object ctrl_deps, object data_deps,
                     object start_micros, object duration_micros)
