# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the per-op loop's ops and edges as the C classes they are (linker/model.pxd), so that their
# fields are read as C struct members, and its containers as the builtin types they are.
cimport cython
from chakra_hooks.linker.model cimport Edge, Op


@cython.locals(op=Op, dep=Op, gap=Op, e=Edge, ops=list, n=Py_ssize_t, i=Py_ssize_t,
               place_of=dict, released=list, groups=dict, unusual=dict,
               members=list, new_ops=list, added=Py_ssize_t, edge_list=list, columns=bint,
               edge_count=Py_ssize_t, at_src=Py_ssize_t, at_dst=Py_ssize_t, at=Py_ssize_t)
cpdef object add_gaps(object trace, object per_resource=*, object replay_dur=*)


cpdef object _end(Op op, object replay_dur)


@cython.locals(a=Op, b=Op, i=Py_ssize_t)
cpdef bint _in_start_order(list ops) except -1


# _measured stays a Python function: it is passed around as a value (a cpdef function's C
# pointer, wrapped for that, mismatches its hidden argument: an error from GCC 14 on).


cpdef tuple _placement(Op op, object per_resource, object dur, set compute_lanes)


@cython.locals(op=Op, anchor=Op, e=Edge, timed=list, has_deps=set)
cpdef object add_window_anchor(object trace)
