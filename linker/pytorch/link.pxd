# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# a linking run as a C class, so that its steps read its state as C struct members and call
# one another directly, and the per-event and per-node loops' events, nodes and ops as the C
# classes they are (linker/pytorch/layouts.pxd, linker/model.pxd), so that their fields are read and
# written as C struct members.
cimport cython
from chakra_hooks.linker.pytorch.layouts cimport EtNode, KEvent
from chakra_hooks.linker.model cimport Edge, Op
from chakra_hooks.linker.pytorch.match cimport KThread

cdef long long _C_LAUNCH


@cython.locals(node=EtNode, root=EtNode, n=EtNode, stack=list, tops=list, pg_inits=list,
               c10d=list, decoded=list)
cpdef tuple select_et(object et)


cdef class PytorchLinker:
    cdef public object et, kt, trace, ops, edges, threads, match, groups, rpc_meta
    cdef public object c10d_on_device, window, has_device, seqs, nested_after, thread_ops
    cdef public object launches, selected, tops, pg_inits, lanes, runtime_by_corr
    cdef public object kernel_names, unknown_dur, host_waits, left_out_host, left_out_device
    cdef public object gloo_runs, comm_on_device, host_timed, kineto_facts

    @cython.locals(node=EtNode)
    cpdef object _read_groups(self)

    @cython.locals(ev=KEvent, ops=Py_ssize_t, outside=Py_ssize_t)
    cpdef object _choose_window(self)

    @cython.locals(top=EtNode, ev=KEvent, tops=list, promoted=list, found=list, by_et=dict)
    cpdef object _promote_escaped(self)

    @cython.locals(ev=KEvent, runtime=KEvent, inner=KEvent, anc=KEvent, out=list,
                   runtime_by_corr=dict, th=KThread, launched=list, linked=Py_ssize_t,
                   acausal=Py_ssize_t)
    cpdef list _prelink_device(self)

    @cython.locals(node=EtNode, op=Op, top_uid=dict)
    cpdef object _host_ops_from_et(self)

    @cython.locals(node=EtNode, ev=KEvent, votes=dict, counts=dict, lanes=dict, by_et=dict)
    cpdef dict _et_thread_lanes(self, list tops)

    @cython.locals(op=Op)
    cpdef Op _et_host_op(self, EtNode node, KEvent ev, object lane)

    @cython.locals(node=EtNode, anc=EtNode, by_id=dict)
    cpdef object _nested_c10d(self, dict top_uid)

    @cython.locals(op=Op, host=KEvent, ops=list, attrs=dict)
    cpdef object _device_op(self, KEvent ev, KEvent runtime, KEvent inner)

    @cython.locals(anc=KEvent)
    cpdef tuple _ancestor_comm(self, KEvent anc)

    @cython.locals(ev=KEvent, annotations=list)
    cpdef object _release_kineto(self)

    @cython.locals(ev=KEvent, ranges=list, comms=list)
    cpdef object _gloo_spans(self)

    @cython.locals(op=Op, edges=list)
    cpdef object _order_edges(self)

    @cython.locals(op=Op, e=Edge, launched=set, kind="long long")
    cpdef object _finish(self)

    @cython.locals(op=Op)
    cpdef Op _add(self, object name, object kind, object on_device, object lane, KEvent ev)


cpdef bint _is_container(EtNode node)


@cython.locals(node=EtNode, ev=KEvent)
cpdef bint _may_escape(EtNode top, KEvent outer, dict by_et)


@cython.locals(node=EtNode, ev=KEvent, ref=KEvent, stack=list)
cpdef object _escaped(list children, KEvent outer, dict by_et, list found)
