# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the converter counts every node it writes through Tally.add, a direct C call on C counters.
cdef class Tally:
    cdef public dict count_by, duration_by
    cdef public object comm_types, comm_bytes, unknown
    cdef public Py_ssize_t nodes, data_deps, ctrl_deps, cpu
    cpdef add(self, object kind, object duration_us, Py_ssize_t data_deps, Py_ssize_t ctrl_deps,
              bint cpu, object comm_type=*, object comm_size=*)
