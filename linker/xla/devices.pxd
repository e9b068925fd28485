# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# a device event as a C class (Cython turns its dataclass into a C dataclass), so that making
# one, once per event as the linker reads the columns, runs a C __init__, not the generated
# Python one; the columns as a C class whose methods read its fields directly; a GPU event's
# values appended to the columns by C stores, its stat records read as bytes.
cimport cython
from cpython.array cimport array as c_array, resize, resize_smart
from cpython.bytes cimport PyBytes_AS_STRING
from cpython.object cimport Py_SIZE
from libc.stdlib cimport free, malloc, qsort


cdef class DeviceEvent:
    cdef public object name, module_key, start_ps, dur_ps, lane, exec_key, text, flops
    cdef public object bytes_accessed, category, transfer, copy, correlation


cdef class DeviceEvents:
    cdef public object start_ps, dur_ps, name, module_key, lane, exec_key, copy, correlation
    cdef public object detail, transfer, strings, details, _string_ids, _packed
    @cython.locals(strings=list, ev=DeviceEvent)
    cpdef DeviceEvent event(self, Py_ssize_t i)
    cpdef bint is_transfer(self, Py_ssize_t i) except -1
    cpdef object correlation_of(self, Py_ssize_t i)
    cpdef fit(self)


@cython.locals(i=Py_ssize_t, before=cython.longlong, value=cython.longlong)
cpdef void _fill_steps(long long[:] steps, const long long[:] values) except *


@cython.locals(i=Py_ssize_t, total=cython.longlong)
cpdef void _fill_sums(long long[:] steps) except *


cdef extern from *:
    # How many buffers an array has exported (memoryviews alive): it must not be resized then.
    # struct arrayobject is the layout Cython declares for cpython.array (arrayarray.h).
    # (A macro: the struct is defined after this text.)
    """
    #define __pyx_chakra_array_exports(column) (((struct arrayobject *)(column))->ob_exports)
    """
    int _exports "__pyx_chakra_array_exports" (object column)


# A value appended to an array column by a resize and a store (devices.py's _push), where
# calling array.append costs about 500 instructions. An array with a buffer exported is left
# to array.append (which refuses to resize it, as resize_smart would not). Raises
# OverflowError for a value the column's type cannot hold, as array.append does.
cdef inline int _push(c_array column, object value) except -1:
    if column is None:
        raise TypeError("_push takes an array")
    if _exports(column):
        column.append(value)
        return 0
    cdef Py_ssize_t at = Py_SIZE(column)
    cdef char code = column.ob_descr.typecode
    cdef long long as_long
    if code == c'q':
        as_long = value
        resize_smart(column, at + 1)
        column.data.as_longlongs[at] = as_long
    elif code == c'i':
        as_long = value
        if as_long < -2147483648 or as_long > 2147483647:
            raise OverflowError("signed integer is out of range for an 'i' array")
        resize_smart(column, at + 1)
        column.data.as_ints[at] = <int>as_long
    elif code == c'b':
        as_long = value
        if as_long < -128 or as_long > 127:
            raise OverflowError("signed char is out of range for a 'b' array")
        resize_smart(column, at + 1)
        column.data.as_schars[at] = <signed char>as_long
    else:
        column.append(value)
    return 0


# An array column cut to its values (DeviceEvents.fit, after _push: it over-allocates by half)
cdef inline int _fit(c_array column) except -1:
    if column is None:
        raise TypeError("_fit takes an array")
    if _exports(column):
        return 0
    return resize(column, Py_SIZE(column))


# A varint of ``size`` (1 to 4) bytes that ends ``raw`` and starts at its byte 3 (a GPU event's
# correlation id stat), as its 7-bit groups; -1 if those bytes are not one varint
# (devices.py: the plain-Python version reads them as one little-endian integer).
cdef inline long long _varint_tail(bytes raw, Py_ssize_t size):
    cdef const unsigned char* at = <const unsigned char*>PyBytes_AS_STRING(raw) + 3
    cdef long long value = 0
    cdef Py_ssize_t i
    for i in range(size):
        if (at[i] >= 0x80) != (i < size - 1):
            return -1
        value |= <long long>(at[i] & 0x7F) << (7 * i)
    return value


@cython.locals(starts=c_array, durs=c_array, corrs=c_array, names=c_array, modules=c_array,
               copies=c_array, raw=bytes, size=Py_ssize_t, value=cython.longlong, count=Py_ssize_t,
               wide=bint, wanted=set, by_metadata=dict, op_names=dict, module_keys=dict)
cpdef object _gpu_device(object view, object ordinal)


@cython.locals(module_key="const int[:]", name="const int[:]", exec_key=list, state=dict, run=list,
               seen=set, i=Py_ssize_t, module=cython.int, op=cython.int)
cpdef object _number_runs(object events)


# Event orders (DeviceEvents.by_start, linking_order) sorted in C: each index beside its key,
# ties in index order, so the order is the stable sort's of devices.py. Python's sort of one
# packed integer per event cost about 1,600 instructions an event, and 40 bytes where these
# pairs take 16.
cdef extern from *:
    bint __builtin_sub_overflow(long long, long long, long long*) nogil
    bint __builtin_mul_overflow(long long, long long, long long*) nogil
    bint __builtin_add_overflow(long long, long long, long long*) nogil


cdef struct _Keyed:
    long long key
    Py_ssize_t index


cdef inline int _by_key_then_index(const void* a, const void* b) noexcept nogil:
    cdef const _Keyed* x = <const _Keyed*>a
    cdef const _Keyed* y = <const _Keyed*>b
    if x.key != y.key:
        return -1 if x.key < y.key else 1
    return -1 if x.index < y.index else (1 if x.index > y.index else 0)


# Indices 0 .. n-1 by (start - low) * step + extra[i] + rank[lane[i]] (extra: a transfer flag
# times ``lanes``, or none; rank: none for by_start), ties in index order; None when a key
# would not fit in 64 bits (the caller sorts Python integers then).
cdef inline object _sorted_by_start(const long long[:] start, long long low, long long step,
                                    const signed char[:] transfer, long long lanes,
                                    const int[:] lane, const long long[:] rank):
    cdef Py_ssize_t n = start.shape[0], i
    cdef long long key, extra
    cdef _Keyed* keyed
    if n == 0:
        return []
    keyed = <_Keyed*>malloc(n * sizeof(_Keyed))
    if keyed == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            if __builtin_sub_overflow(start[i], low, &key) or __builtin_mul_overflow(key, step, &key):
                return None
            extra = 0
            if transfer is not None:
                extra = transfer[i] * lanes
            if lane is not None:
                extra += rank[lane[i]]
            if __builtin_add_overflow(key, extra, &key):
                return None
            keyed[i].key = key
            keyed[i].index = i
        qsort(keyed, n, sizeof(_Keyed), _by_key_then_index)
        return [keyed[i].index for i in range(n)]
    finally:
        free(keyed)


# Item ``i`` of a column: read in C from an array of the typecodes columns have (``column[i]``
# on an array costs a generic item call), else as ``column[i]`` (a list, once widened; an index
# from the end). Out of range raises IndexError, as indexing does.
cdef inline object _item(object column, Py_ssize_t i):
    cdef c_array values
    cdef char code
    if type(column) is c_array and i >= 0:
        values = <c_array>column
        if i >= Py_SIZE(values):
            raise IndexError("array index out of range")
        code = values.ob_descr.typecode
        if code == c'q':
            return values.data.as_longlongs[i]
        if code == c'i':
            return values.data.as_ints[i]
        if code == c'b':
            return values.data.as_schars[i]
    return column[i]
