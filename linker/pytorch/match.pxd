# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# Kineto events and ET nodes as KEvent / EtNode (linker/pytorch/layouts.pxd), so that the matching
# loops read and write their fields as C struct members; a thread's ranges as a C class, so
# that finding the range open around a launch (once per device op) is a direct call.
cimport cython
from chakra_hooks.linker.pytorch.layouts cimport EtNode, KEvent


cdef class KThread:
    cdef public object key
    cdef public list events, starts, clipped

    @cython.locals(i=Py_ssize_t, ev=KEvent, starts=list, lo=Py_ssize_t, hi=Py_ssize_t,
                   mid=Py_ssize_t, start="long long", dur="long long")
    cpdef KEvent innermost(self, long long t)


@cython.locals(ev=KEvent, events=list, stack=list, ends=list, threads=dict, starts=list,
               clipped=list, members=list)
cpdef dict index_threads(list host)


@cython.locals(ev=KEvent, count=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t)
cpdef object _longer_first_at_equal_starts(list events)


cpdef object _longest_first(KEvent ev)


@cython.locals(ev=KEvent, node=EtNode, index=dict, out=dict)
cpdef dict _by_key(list nodes, list host, str key)


@cython.locals(ev=KEvent, node=EtNode, nodes=list)
cpdef object match_et(object et, list host, dict threads)
