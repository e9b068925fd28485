# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the per-device linker's typed helpers.
cimport cython
from chakra_hooks.linker.model cimport Edge, EdgeColumns, Op
from cpython.array cimport array as c_array
from chakra_hooks.linker.xla.devices cimport DeviceEvent, _push


cdef dict _FIELDS


cdef class DeviceOpAttrs:
    cdef public object hlo_module, hlo_category, correlation, hlo_op, hlo_opcode, others
    cpdef list items(self)
    @cython.locals(field=Py_ssize_t)
    cpdef object get(self, object name, object default=*)


# the end as the list's own integer object: no C integer to box again for the arithmetic
cpdef object _event_end(list ops, list firsts, Py_ssize_t at)


cpdef list _event_uids(list ops, list firsts, Py_ssize_t at)


@cython.locals(src_ops=Py_ssize_t, dst_ops=Py_ssize_t)
cpdef void _order_edges(EdgeColumns edges, list ops, list firsts, Py_ssize_t before, Py_ssize_t after,
                        object kind) except *


# uid: a C integer, so that ops[uid] is a direct list read (an event's first op holds its times)
@cython.locals(k=Py_ssize_t, at=Py_ssize_t, last=Py_ssize_t, j=Py_ssize_t, uid=Py_ssize_t,
               first=Op, op=Op, running=list)
cpdef void _lane_edges(EdgeColumns edges, list ops, list firsts, const long long[:] on_lane,
                       object kind) except *


@cython.locals(k=Py_ssize_t, uid=Py_ssize_t, before=Op, after=Op)
cpdef bint _one_at_a_time(list ops, list firsts, const long long[:] on_lane) except -1


@cython.locals(op=Op, attrs=DeviceOpAttrs)
cpdef Op _new_op(list ops, DeviceEvent ev, object kind, str name=*)


cpdef object _shared(object value, dict table)


@cython.locals(at=Py_ssize_t, op=Op, by_lane=dict, on_lane=c_array, lane=str)
cpdef dict _events_by_lane(list ops, list firsts)


@cython.locals(i=Py_ssize_t, m=cython.longlong, n=cython.longlong, d=cython.longlong,
               c=cython.longlong, firsts=list, seen=set)
cpdef list _first_of_each_kind(object order, const int[:] module_key, const int[:] name,
                               const int[:] detail, const signed char[:] copy)
