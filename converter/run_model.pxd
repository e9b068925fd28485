# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the frame scanner's loops on C integers over the frame's bytes through a pointer, and the
# critical path's loops on the columns as typed views.
cimport cython

@cython.locals(count_v="long long[:]", users_v="long long[:]", fill_v="long long[:]",
               deps_v="long long[:]", dep_at_v="long long[:]", k=Py_ssize_t, p=Py_ssize_t,
               d=Py_ssize_t)
cpdef tuple _users_of(Py_ssize_t n, object deps, object dep_at)

@cython.locals(n=Py_ssize_t, user_at_v="long long[:]", users_v="long long[:]",
               dep_at_v="long long[:]", dur_v="const double[:]", waiting_v="long long[:]",
               start_v="double[:]", via_v="long long[:]", finish_v="double[:]", ready=list,
               p=Py_ssize_t, k=Py_ssize_t, user=Py_ssize_t, f=double, best=double,
               last=Py_ssize_t)
cpdef tuple longest_path(object c, object dur)

cdef Py_ssize_t _after_varint

cpdef object _scan_frame(bytes frame)

@cython.locals(at=Py_ssize_t, end=Py_ssize_t, key="unsigned long long",
               value="unsigned long long", size="unsigned long long", field="unsigned long long",
               wire="unsigned long long", nid="unsigned long long",
               node_type="unsigned long long", start="unsigned long long",
               dur="unsigned long long", data_deps=list, ctrl_deps=list, deps=list, values=dict)
cdef object _scan_node(const unsigned char* frame, Py_ssize_t n)

@cython.locals(name_at=Py_ssize_t, name_end=Py_ssize_t, text_at=Py_ssize_t, text_end=Py_ssize_t,
               which="unsigned long long", number="unsigned long long", key="unsigned long long",
               field="unsigned long long", wire="unsigned long long", size="unsigned long long")
cdef bint _scan_attr(const unsigned char* frame, Py_ssize_t at, Py_ssize_t end,
                     dict values) except -1

@cython.locals(value="unsigned long long", shift=int, byte="unsigned long long")
cdef unsigned long long _varint(const unsigned char* frame, Py_ssize_t at, Py_ssize_t end)
