# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# the per-node loops' nodes as EtNode (linker/pytorch/layouts.pxd), so that their fields are read and
# written as C struct members, and their containers as the builtin types they are.
cimport cython
from chakra_hooks.linker.pytorch.layouts cimport EtNode, StdRfId, StdScope, StdSeqId, StdTid
from chakra_hooks.linker.pytorch.et_nodes cimport as_json


@cython.locals(node=EtNode)
cpdef object _drop_raws(list nodes)


@cython.locals(node=EtNode, part=list, raws=list, texts=list, index=Py_ssize_t, lo=Py_ssize_t)
cpdef object _keep_texts(list nodes)


@cython.locals(node=EtNode, part=list, index=Py_ssize_t, lo=Py_ssize_t, names=dict, at=Py_ssize_t,
               std=bint)
cpdef object _finish_nodes(list nodes, object path)


@cython.locals(rf=StdRfId, seq=StdSeqId, scope=StdScope, tid=StdTid)
cpdef object _set_std_attrs(EtNode node, list attr_list)


@cython.locals(node=EtNode, parent=EtNode, nodes=list, by_id=dict, roots=set)
cpdef object read_host_et(object path)


@cython.locals(node=EtNode, seen=set, stack=list)
cpdef object _check_tree(list nodes, set roots, object get, object path)
