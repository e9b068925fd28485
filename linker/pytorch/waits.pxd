# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the ops, edges and cuts of the per-edge and per-op loops as the C classes they are
# (linker/model.pxd), so that their fields are read and written as C struct members.
cimport cython
from chakra_hooks.linker.model cimport Edge, Op
from chakra_hooks.linker.pytorch.layouts cimport KEvent

cdef long long _C_LAUNCH, _C_PARENT


cdef class _Cut:
    cdef public object a, b, leaving, awaited


@cython.locals(e=Edge, host=Op, child=Op, cut=_Cut, ops=list, edges=list, runtime_of=dict,
               kind="long long")
cpdef object split_host_ops(object linker)


@cython.locals(op=Op, a=Op, b=Op, late=Op, done=list, ends=list, comm=list, comm_ends=list,
               members=list, lane=str, i=Py_ssize_t, j=Py_ssize_t, added=Py_ssize_t,
               woken_late=Py_ssize_t)
cpdef object add_thread_waits(list ops, list edges)


cpdef bint _timed(Op op)


@cython.locals(cut=_Cut)
cpdef object _launch_cut(Op host, Op device, KEvent runtime, Edge edge, object cuts)


@cython.locals(host=Op, cut=_Cut, ops=list, edges=list, starts=list, uids=list)
cpdef object _resolve_waits(object linker, object cuts)


@cython.locals(host=Op, part=Op, before=Op, cut=_Cut, last=_Cut, e=Edge, merged=list,
               parts=list, tied=set, i=Py_ssize_t)
cpdef object _apply(list ops, list edges, object uid, list found, list leaving)
