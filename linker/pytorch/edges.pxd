# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the per-op loops' ops, edges and ET nodes as the C classes they are (linker/model.pxd,
# linker/pytorch/layouts.pxd), so that their fields are read as C struct members, and their
# containers as the builtin types they are.
cimport cython
from chakra_hooks.linker.pytorch.layouts cimport EtNode, KEvent
from chakra_hooks.linker.model cimport Edge, Op

cdef long long _C_PARENT


@cython.locals(op=Op, node=EtNode, ops=list, edges=list, tops=list, seen=set, producer=dict,
               by_et=dict)
cpdef list data_edges(object linker)


@cython.locals(op=Op, node=EtNode, ops=list, by_et=dict, stack=list, forward=dict,
               backward=dict)
cpdef object _autograd_edges(object linker, list tops, list edges)


@cython.locals(e=Edge, op=Op, ops=list, starts=list, ends=list, kept=list, seen=set,
               width=Py_ssize_t, backwards=Py_ssize_t, late=Py_ssize_t, src=Py_ssize_t,
               dst=Py_ssize_t, pair=object, kind="long long", parent="long long")
cpdef object prune_edges(object linker)


@cython.locals(op=Op, lane=str, per_device=dict, lanes=dict, entries=list, ends=dict)
cpdef dict _ends_by_device(list ops)


@cython.locals(rt=KEvent, ends=dict, starts=dict)
cpdef tuple _launch_times(list launches)
