# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the tensor-id walk calls itself directly, and reads its lists as the builtin type they are;
# keeping an IO's text is a direct C call from the reader (linker/pytorch/et.pxd).
cimport cython


@cython.locals(item=object)
cpdef object collect_tensor_ids(object value, list out)


cpdef tuple as_json(object values, object shapes, object types)
