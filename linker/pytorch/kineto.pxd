# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the per-event loop's containers as the builtin types they are, so that their methods are
# direct C calls rather than Python method calls; its time conversion a C call on C numbers;
# and its events as KEvent (linker/pytorch/layouts.pxd), so their fields are read and written as C
# struct members.
cimport cython
from chakra_hooks.linker.pytorch.layouts cimport KEvent

@cython.locals(number=cython.double, whole=cython.longlong)
cpdef object _ns(object value)


cdef long long _SLOW, _INT_LIMIT
cdef double _ROUND_LIMIT
cdef long long _TIME_LIMIT_NS


@cython.locals(number=cython.double, scaled=cython.double, whole=cython.longlong, rest=cython.double)
cdef inline long long _ns_at(object value, long long base) except? -1


@cython.locals(start=cython.longlong, dur=cython.longlong)
cdef inline bint _times_in_c(KEvent ev, long long base, list unknown_dur) except -1


@cython.locals(pids=set, out_of=dict, ids=dict, names=dict, host=list, device=list, full_names=dict,
               common_events=list, common_raws=list, full_events=list, full_raws=list,
               devices_before=Py_ssize_t, uncorrelated=Py_ssize_t, ev=KEvent, phase_of=dict,
               c_times=cython.bint, c_base=cython.longlong)
cpdef object _read_events(object trace, list events, Py_ssize_t first)


@cython.locals(ev=KEvent)
cpdef object _set_args(object trace, list events, Py_ssize_t first, list kept, list raws,
                       object decoder)


@cython.locals(ev=KEvent, kept=list, starts=set, shared=set, seen=set, unique=list)
cpdef object drop_duplicates(object trace)


@cython.locals(ev=KEvent, kept=list, bad=list, sample=list)
cpdef object drop_out_of_range(object trace)
