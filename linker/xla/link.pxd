# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# what the per-device linker makes per event as a C class (Cython turns its dataclass into a
# C dataclass: a C __init__, fields read directly where a local is declared one).
cimport cython
from chakra_hooks.linker.model cimport Edge, Op
from chakra_hooks.linker.xla.devices cimport DeviceEvent


cdef class _Placed:
    # first stays the uid's own int object, which the edges share (a C integer would make a
    # new int object for every edge that names it)
    cdef public Py_ssize_t index
    cdef public object first
    cdef public Py_ssize_t count
    cdef public object module, inst


cpdef void _order_edges(list edges, _Placed before, _Placed after, object kind) except *


@cython.locals(k=Py_ssize_t, before=_Placed, after=_Placed)
cpdef bint _one_at_a_time(list placed, object start_ps, object dur_ps) except -1


@cython.locals(op=Op, attrs=dict)
cpdef Op _new_op(list ops, DeviceEvent ev, object kind, str name=*)
