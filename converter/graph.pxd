# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# writing a node calls the encoder's and the tally's methods directly, not through Python's
# method lookup, and reads the op's fields directly; resolving edges uses its dicts, sets and
# lists through direct C calls.
cimport cython
from chakra_hooks.converter.summary cimport Tally
from chakra_hooks.converter.wire cimport (NodeEncoder, _append_varint, _buffer_bytes, _extend,
                                          _int_field, _io_bytes, _new_buffer, _packed,
                                          _packed_pair, _put_byte)
from chakra_hooks.linker.model cimport Edge, Op, TensorIO

cdef long long _C_US, _C_HALF_US, _C_DATA, _C_PARENT
cdef dict _COMMON_TYPES
cdef int _W_ID, _W_CTRL, _W_DATA, _W_START, _W_DURATION, _W_INPUTS, _W_OUTPUTS
cdef bint _COMPILED
@cython.locals(small="long long")
cpdef object round_us(object ps)
@cython.locals(op=Op)
cpdef bint _all_whole_ns(list ops) except -1
@cython.locals(op=Op, writer=_NodeWriter, others=Tally, collective_tally=Tally, ops=list,
               index=Py_ssize_t, dep_list=list, bodies=list)
cpdef object build_graph(object trace, object target=*, object keep_mem=*, object consume=*)


@cython.locals(io=TensorIO, small_offset="long long", small_base_us="long long",
               small_base_ns="long long", small_offset_us="long long", small_dur="long long",
               small=bint)
cpdef bytes _make_node(Op op, object deps, str exact_unit, NodeEncoder enc, Tally tally,
                       object base_ps, object base_us, object base_ns)


@cython.locals(incoming=dict, places=list, stats=dict, data=list, ctrl=list,
               edges_out=Py_ssize_t, i=Py_ssize_t, edge=Edge, by_place=bint, listed=bint,
               count=Py_ssize_t, edge_list=list, columns=bint, edge_count=Py_ssize_t,
               place=Py_ssize_t, src="long long", dst="long long", kind="long long")
cpdef tuple _resolve_edges(object trace, list ops, bint all_kept=*, bint consume=*)
cpdef object _with_source(object slot, object src, object kind)
@cython.locals(one="long long", first="long long", second="long long")
cpdef object _with_place_source(object slot, long long src, long long kind)


@cython.locals(place=Py_ssize_t, op=Op)
cpdef bint _numbered_by_place(list ops) except -1


@cython.locals(by_place=bint, dst_op=Op)
cpdef bint _in_time_order(object incoming, object kept)


@cython.locals(dst=Py_ssize_t, dst_op=Op, one="long long", first="long long",
               second="long long")
cpdef bint _places_in_time_order(list places, list ops) except -1


@cython.locals(src_op=Op)
cdef inline bint _place_before(list ops, Py_ssize_t src, Py_ssize_t dst, object dst_start) except -1


@cython.locals(src_op=Op)
cpdef bint _runs_before(object kept, bint by_place, object src, object dst, object dst_start)


@cython.final
cdef class _NodeWriter:
    cdef NodeEncoder enc
    cdef bint ns, usable
    cdef tuple start_prefixes, duration_prefixes, cpu_fields
    cdef list names
    cdef dict lanes
    cdef object base_ps
    cdef long long base_us, base_ns
    cdef dict int_prefixes
    @cython.locals(io=TensorIO, node_type=int, small_offset="long long", small_dur="long long",
                   offset_us="long long", start_us="long long", duration_us="long long",
                   start_time="long long", duration_time="long long", data_count=Py_ssize_t,
                   ctrl_count=Py_ssize_t, data_first="long long", data_second="long long",
                   ctrl_first="long long", ctrl_second="long long", first="long long",
                   second="long long", cpu=bint, prefixes=tuple, buf=bytearray,
                   enc=NodeEncoder, names=dict, field=bytes, lane=str)
    cpdef bytes node(self, Op op, object deps, Tally tally)
    @cython.locals(fields=dict)
    cpdef cached_attr(self, bytearray buf, str name, object value)
