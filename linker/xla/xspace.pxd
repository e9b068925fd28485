# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# stepping over a long line's event records reads the file's bytes as C bytes.
cimport cython


@cython.locals(pos=Py_ssize_t, rec=Py_ssize_t, first=Py_ssize_t, length=Py_ssize_t)
cpdef tuple _line_parts(const unsigned char[:] data, Py_ssize_t start, Py_ssize_t end,
                        Py_ssize_t part_bytes)
