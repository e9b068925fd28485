# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# Kineto events and ET nodes as KEvent / EtNode (linker/layouts.pxd), so that the matching
# loops read and write their fields as C struct members.
cimport cython
from chakra_hooks.linker.layouts cimport EtNode, KEvent


@cython.locals(ev=KEvent, events=list, stack=list, ends=list, threads=dict)
cpdef dict index_threads(list host)


@cython.locals(ev=KEvent, count=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t)
cpdef object _longer_first_at_equal_starts(list events)


cpdef object _longest_first(KEvent ev)


@cython.locals(ev=KEvent, node=EtNode, index=dict, out=dict)
cpdef dict _by_key(list nodes, list host, str key)


@cython.locals(ev=KEvent, node=EtNode, nodes=list)
cpdef object match_et(object et, list host, dict threads)
