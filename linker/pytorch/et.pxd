# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the per-node loops' nodes as EtNode (linker/pytorch/layouts.pxd), so that their fields are read and
# written as C struct members, and their containers as the builtin types they are.
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memchr, memcmp
from chakra_hooks.linker.pytorch.layouts cimport EtNode, StdRfId, StdScope, StdSeqId, StdTid
from chakra_hooks.linker.pytorch.et_nodes cimport as_json


@cython.locals(node=EtNode)
cpdef object _drop_raws(list nodes)


@cython.locals(node=EtNode, part=list, raws=list, texts=list, index=Py_ssize_t, lo=Py_ssize_t)
cpdef object _keep_texts(list nodes)


@cython.locals(node=EtNode, part=list, index=Py_ssize_t, lo=Py_ssize_t, names=dict, at=Py_ssize_t,
               std=bint, values="long long[:]")
cpdef object _finish_nodes(list nodes, object path)


@cython.locals(rf=StdRfId, seq=StdSeqId, scope=StdScope, tid=StdTid)
cpdef object _set_std_attrs(EtNode node, list attr_list)


@cython.locals(node=EtNode, parent=EtNode, nodes=list, by_id=dict, roots=set)
cpdef object read_host_et(object path)


@cython.locals(node=EtNode, seen=set, stack=list)
cpdef object _check_tree(list nodes, set roots, object get, object path)


# Reading the standard attrs' values from the attrs lists' text: its bytes through a C pointer
# (the joined text is held by `joined`), the values as C integers.
@cython.locals(joined=bytes, text="const unsigned char*", found="long long[:]", end=Py_ssize_t,
               at=Py_ssize_t, index=Py_ssize_t, count=Py_ssize_t, code=int, first=int, third=int,
               fourth=int, fifth=int, last=int,
               value="long long", v_first="long long", v_third="long long",
               v_fourth="long long", v_fifth="long long", rf_id="long long",
               seq_id="long long", scope="long long", tid="long long")
cpdef object _scan_std_chunk(list raws)


@cython.locals(after=Py_ssize_t, close=Py_ssize_t, code=int,
               value="long long", seen=int, key=int)
cdef (Py_ssize_t, int, long long) _attr_at(const unsigned char* text, Py_ssize_t at,
                                           Py_ssize_t end) noexcept


@cython.locals(name_sep=bytes, type_sep=bytes, value_sep=bytes, start=Py_ssize_t,
               close=Py_ssize_t, code=int, value="long long", after=Py_ssize_t)
cdef (Py_ssize_t, int, long long) _spelled_attr_at(const unsigned char* text, Py_ssize_t at,
                                                   Py_ssize_t end) noexcept


@cython.locals(prefix=bytes, after=Py_ssize_t, value="long long")
cdef (Py_ssize_t, int, long long) _torch_attr_at(const unsigned char* text, Py_ssize_t at,
                                                 Py_ssize_t end, Py_ssize_t place) noexcept


@cython.locals(close=Py_ssize_t, value="long long")
cdef inline (Py_ssize_t, long long) _attr_value_end(const unsigned char* text, Py_ssize_t start,
                                                    Py_ssize_t end) noexcept


cdef tuple _TORCH_SPACED, _TORCH_TIGHT, _TORCH_CODES
cdef Py_ssize_t _TORCH_COUNT


cdef inline bint _starts(const unsigned char* text, Py_ssize_t at, Py_ssize_t end,
                         bytes literal) noexcept


@cython.locals(byte="unsigned char")
cdef inline Py_ssize_t _skip_blank(const unsigned char* text, Py_ssize_t at,
                                   Py_ssize_t end) noexcept


@cython.locals(byte="unsigned char")
cdef inline Py_ssize_t _string_end(const unsigned char* text, Py_ssize_t at, Py_ssize_t end,
                                   bint escapes) noexcept


cdef inline int _key_at(const unsigned char* text, Py_ssize_t start, Py_ssize_t end) noexcept


@cython.locals(size=Py_ssize_t)
cdef int _std_code(const unsigned char* text, Py_ssize_t start, Py_ssize_t stop) noexcept


@cython.locals(i=Py_ssize_t)
cdef inline bint _same_bytes(const unsigned char* text, Py_ssize_t start, bytes name) noexcept


cdef inline bint _bytes_at(const unsigned char* text, Py_ssize_t start, bytes name) noexcept:
    return memcmp(text + start, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)) == 0


@cython.locals(byte="unsigned char", negative=bint, start=Py_ssize_t, value="long long",
               digits=Py_ssize_t)
cdef (Py_ssize_t, long long) _integer(const unsigned char* text, Py_ssize_t at,
                                      Py_ssize_t end) noexcept


cdef int _RF_ID, _SEQ_ID, _SCOPE, _TID, _STD_OTHER, _STD_END, _KEY_NAME, _KEY_TYPE, _KEY_VALUE
cdef Py_ssize_t _DIGITS_MAX
cdef long long _NOT_INT


# et.py's _string_end in C: a string's first bytes looked at one by one (keys, names and
# types are short), the rest of a longer one by memchr, the closing quote and then any
# backslash before it (a string rarely has one); a loop took a dozen instructions a byte, and
# the attrs' text is half of an ET's bytes (op_schema).
cdef inline Py_ssize_t _quote_at(const unsigned char* text, Py_ssize_t at, Py_ssize_t end,
                                 bint escapes) noexcept:
    cdef Py_ssize_t stop = at + 32 if at + 32 < end else end
    cdef unsigned char byte
    while at < stop:
        byte = text[at]
        if byte == 34:
            return at
        if byte == 92:
            if not escapes:
                return -1
            at += 1
        at += 1
    if at >= end:
        return -1
    cdef const unsigned char* start = text + at
    cdef const unsigned char* quote = <const unsigned char*>memchr(start, 34, end - at)
    if quote == NULL:
        return -1
    if memchr(start, 92, quote - start) == NULL:
        return quote - text
    if not escapes:
        return -1
    while at < end:  # a string with escapes: byte by byte
        if text[at] == 34:
            return at
        if text[at] == 92:
            at += 1
        at += 1
    return -1
cdef bytes _NAME_SPACED, _TYPE_SPACED, _VALUE_SPACED, _NAME_TIGHT, _TYPE_TIGHT, _VALUE_TIGHT
