# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# a device event as a C class (Cython turns its dataclass into a C dataclass), so that making
# one, once per event as the linker reads the columns, runs a C __init__, not the generated
# Python one; the columns as a C class whose methods read its fields directly.
cimport cython


cdef class DeviceEvent:
    cdef public object name, module_key, start_ps, dur_ps, lane, exec_key, text, flops
    cdef public object bytes_accessed, category, transfer, copy, correlation


cdef class DeviceEvents:
    cdef public object start_ps, dur_ps, name, module_key, lane, exec_key, copy, correlation
    cdef public object detail, transfer, strings, details, _string_ids, _packed
    @cython.locals(strings=list)
    cpdef DeviceEvent event(self, Py_ssize_t i)
    cpdef bint is_transfer(self, Py_ssize_t i) except -1
    cpdef object correlation_of(self, Py_ssize_t i)


@cython.locals(i=Py_ssize_t, before=cython.longlong, value=cython.longlong)
cpdef void _fill_steps(long long[:] steps, const long long[:] values) except *


@cython.locals(i=Py_ssize_t, total=cython.longlong)
cpdef void _fill_sums(long long[:] steps) except *
