# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the converter counts every node it writes through Tally.add, a direct C call on C counters.
cimport cython

cdef long long _COMM_TYPE_BITS

@cython.final
cdef class Tally:
    cdef public dict count_by, duration_by
    cdef public object comm_types, comm_bytes, unknown
    cdef public Py_ssize_t nodes, data_deps, ctrl_deps, cpu
    # add_plain's counts by node type (0-7), not yet in count_by and duration_by (flush)
    cdef long long _pending_count[8]
    cdef long long _pending_duration[8]
    cpdef add(self, object kind, object duration_us, Py_ssize_t data_deps, Py_ssize_t ctrl_deps,
              bint cpu, object comm_type=*, object comm_size=*)
    cpdef add_plain(self, int kind, long long duration_us, Py_ssize_t data_deps,
                    Py_ssize_t ctrl_deps, bint cpu)
    @cython.locals(kind=int)
    cpdef flush(self)
