# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# stepping over a long line's event records reads the file's bytes as C bytes, and an event's
# stat records are read as C bytes too.
cimport cython


@cython.locals(pos=Py_ssize_t, rec=Py_ssize_t, first=Py_ssize_t, length=Py_ssize_t)
cpdef tuple _line_parts(const unsigned char[:] data, Py_ssize_t start, Py_ssize_t end,
                        Py_ssize_t part_bytes)


@cython.locals(raw=bytes, out=dict, hit=tuple)
cpdef dict _pick(object stats, dict wanted, dict cache, object miss)


@cython.locals(raw=bytes, hit=tuple)
cpdef object _int_stat(object stats, Py_ssize_t stat_id, dict cache, object miss)
