# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the ops and edges of a linked trace as C classes (Cython turns their dataclasses into C
# dataclasses), so that making one runs a C __init__, not the generated Python one (about
# 4,000 instructions an op), and code that declares them reads their fields directly.
cimport cython


cdef class CommInfo:
    cdef public object size_bytes, comm_type, group, src, dst, tag


cdef class TensorIO:
    cdef public object values, shapes, types


cdef class Op:
    # In the dataclass's field order. name and lane as str: their startswith calls (several
    # per op) are then direct C calls.
    cdef public object uid
    cdef public str name
    cdef public object kind, on_device
    cdef public str lane
    cdef public object start_ps, dur_ps, comm, bytes, flops
    cdef public object inputs, outputs, attrs


cdef class Edge:
    cdef public object src, dst, kind


cdef class EdgeColumns:
    cdef public object src, dst, kind
    cdef list _pending
    cpdef add(self, object src, object dst, object kind)
    cpdef append(self, Edge edge)
    cpdef _flush(self)
    cpdef tuple columns(self)


@cython.locals(at=Py_ssize_t, i=Py_ssize_t, kinds="signed char[:]", uids="long long[:]")
cpdef _move(list pending, Py_ssize_t first, object column)
