# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the tensor-id walk calls itself directly, and reads its lists as the builtin type they are;
# keeping an IO's text is a direct C call from the reader (linker/pytorch/et.pxd).
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize


@cython.locals(item=object)
cpdef object collect_tensor_ids(object value, list out)


cpdef tuple as_json(object values, object shapes, object types)


# bytes(raw) without bytes()' own dispatch (its arguments parsed, a __bytes__ looked for on
# msgspec.Raw) before the same buffer copy: as_json runs three a kept node's inputs or outputs.
cdef inline bytes _copy_bytes(object raw):
    cdef Py_buffer view
    PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE)
    try:
        return PyBytes_FromStringAndSize(<char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
