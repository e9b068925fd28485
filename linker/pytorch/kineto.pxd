# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the per-event loop's containers as the builtin types they are, so that their methods are
# direct C calls rather than Python method calls; its time conversion a C call on C numbers;
# and its events as KEvent (linker/pytorch/layouts.pxd), so their fields are read and written as C
# struct members.
cimport cython
from libc.string cimport memcmp, memcpy
from chakra_hooks.linker.pytorch.layouts cimport KEvent


cdef extern from "Python.h":
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)


cdef Py_ssize_t _NAME_SLOTS


# _same_text's comparison (kineto.py), for two str objects (the reader's are fields msgspec
# decoded as str, or names it interned; None, from any other caller, is equal only to None)
cdef inline bint _text_equal(str a, str b) noexcept:
    if a is None or b is None:
        return a is b
    cdef Py_ssize_t size = PyUnicode_GET_LENGTH(a)
    cdef int kind = PyUnicode_KIND(a)
    if size != PyUnicode_GET_LENGTH(b) or kind != PyUnicode_KIND(b):
        return False
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), size * kind) == 0


# _slot_of's place (kineto.py): the text's size and its first, middle and last eight bytes,
# mixed by multiplications (a short text: its bytes)
cdef inline Py_ssize_t _text_slot(str text) noexcept:
    if text is None:
        return 0
    cdef Py_ssize_t size = PyUnicode_GET_LENGTH(text) * PyUnicode_KIND(text)
    cdef const unsigned char* data = <const unsigned char*>PyUnicode_DATA(text)
    cdef unsigned long long mix = (<unsigned long long>size + 1) * 0x9E3779B97F4A7C15ULL
    cdef unsigned long long word = 0
    cdef Py_ssize_t i
    if size >= 8:
        memcpy(&word, data, 8)
        mix = (mix ^ word) * 0x100000001B3ULL
        memcpy(&word, data + (size >> 1) - 4, 8)
        mix = (mix ^ word) * 0x100000001B3ULL
        memcpy(&word, data + size - 8, 8)
        mix = (mix ^ word) * 0x9E3779B97F4A7C15ULL
    else:
        for i in range(size):
            mix = (mix ^ data[i]) * 0x100000001B3ULL
    return <Py_ssize_t>((mix >> 40) & <unsigned long long>(_NAME_SLOTS - 1))

cpdef Py_ssize_t _slot_of(str text) noexcept
cpdef bint _same_text(str a, str b) noexcept


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
               c_times=cython.bint, c_base=cython.longlong, cached=list, slot=Py_ssize_t,
               last_cat=str, interned=str)
cpdef object _read_events(object trace, list events, Py_ssize_t first)


@cython.locals(ev=KEvent)
cpdef object _set_args(object trace, list events, Py_ssize_t first, list kept, list raws,
                       object decoder)


@cython.locals(ev=KEvent, kept=list, starts=set, shared=set, seen=set, unique=list)
cpdef object drop_duplicates(object trace)


@cython.locals(ev=KEvent, kept=list, bad=list, sample=list)
cpdef object drop_out_of_range(object trace)
