# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the walk over a stream's length prefixes reads the file's bytes as C bytes through a typed
# view, one C comparison and addition per frame, where indexing a bytes object made a Python
# int of every byte read (about 1,500 instructions a frame).
cimport cython
from chakra_hooks.converter.wire cimport _append_varint, _extend

cdef bint _COMPILED


@cython.locals(buf=bytearray, body=object)
cpdef object _framed(list bodies)


@cython.locals(starts=list, pos=Py_ssize_t, end=Py_ssize_t, start=Py_ssize_t, size=Py_ssize_t)
cpdef list frame_starts(const unsigned char[:] buf, object path=*)
