# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# a device event as a C class (Cython turns its dataclass into a C dataclass), so that making
# one, once per event as the linker reads the columns, runs a C __init__, not the generated
# Python one.
cdef class DeviceEvent:
    cdef public object name, module_key, start_ps, dur_ps, lane, exec_key, text, flops
    cdef public object bytes_accessed, category, transfer, copy, correlation
