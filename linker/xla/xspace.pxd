# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# stepping over a long line's event records reads the file's bytes as C bytes, and an event's
# stat records are read as C bytes too.
cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize


@cython.locals(pos=Py_ssize_t, rec=Py_ssize_t, first=Py_ssize_t, length=Py_ssize_t)
cpdef tuple _line_parts(const unsigned char[:] data, Py_ssize_t start, Py_ssize_t end,
                        Py_ssize_t part_bytes)


@cython.locals(raw=bytes, out=dict, hit=tuple)
cpdef dict _pick(object stats, dict wanted, dict cache, object miss)


@cython.locals(raw=bytes, hit=tuple)
cpdef object _int_stat(object stats, Py_ssize_t stat_id, dict cache, object miss)


# A line's events read from its bytes (the compiled build's PlaneView.events): the varints in C
# numbers, each stat record copied out as bytes by one C call.
@cython.locals(pos=Py_ssize_t, limit=Py_ssize_t, rec=Py_ssize_t, in_event=bint,
               mid=cython.ulonglong, offset=cython.ulonglong, dur=cython.ulonglong, stats=list,
               key=cython.ulonglong, shift=cython.int, byte=cython.uchar, wire=cython.int,
               value=cython.ulonglong, piece=cython.ulonglong, field=cython.ulonglong)
cpdef Py_ssize_t _scan_events(const unsigned char[:] data, Py_ssize_t start, Py_ssize_t end,
                              object base, list out, Py_ssize_t most) except -1


cdef inline object _signed(unsigned long long value)


cdef inline bytes _bytes_at(const unsigned char[:] data, Py_ssize_t pos, Py_ssize_t length):
    if length == 0:
        return b""
    with cython.boundscheck(False), cython.wraparound(False):  # _scan_events checked the span
        return PyBytes_FromStringAndSize(<const char*>&data[pos], length)
