# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the tensor-id walk calls itself directly, and reads its lists as the builtin type they are.
cimport cython


@cython.locals(item=object)
cpdef object collect_tensor_ids(object value, list out)
