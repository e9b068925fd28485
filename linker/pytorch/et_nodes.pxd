# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the tensor-id walk calls itself directly, and reads its lists as the builtin type they are;
# keeping an IO's text is a direct C call from the reader (linker/pytorch/et.pxd).
cimport cython

cdef bint _COMPILED
cdef long long _FRAMES[256]  # _scan_tensor_ids' open lists, four numbers each
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


@cython.locals(text="const unsigned char*", end=Py_ssize_t, stack="long long*", depth=int,
               nested=Py_ssize_t, at=Py_ssize_t, byte="unsigned char", top=Py_ssize_t,
               place="long long", start=Py_ssize_t, negative=bint, digits=Py_ssize_t,
               value="long long", whole=bint)
cpdef object _scan_tensor_ids(bytes data)


cdef inline Py_ssize_t _skip_space(const unsigned char* text, Py_ssize_t at,
                                   Py_ssize_t end) noexcept


@cython.locals(byte="unsigned char")
cdef inline Py_ssize_t _string_after(const unsigned char* text, Py_ssize_t at,
                                     Py_ssize_t end) noexcept
