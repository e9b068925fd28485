"""PyTorch host execution trace (ET) reader: every schema from ``1.0.1`` to ``1.1.1-chakra.1.0.0``.

Two layouts exist and both are read into the same :class:`EtNode`:

- ``1.0.1`` (and the ``execution_graph`` era): flat keys ``parent``, ``rf_id``, ``tid``,
  ``scope``, ``inputs`` (a list of values), ``input_shapes``, ``input_types``, ``outputs``...
- ``1.0.2`` and later: ``ctrl_deps`` (the parent id), ``inputs`` / ``outputs`` as
  ``{values, shapes, types, strides}`` and ``attrs`` as ``[{name, type, value}]``.

The file is decoded once, by msgspec into typed structs (tensor values stay raw slices until
a node's inputs are read; ``attrs`` lists are decoded CHUNK nodes per call, as a union tagged
by name when they hold the standard attrs only). Nodes are returned sorted by id: ids are
given at op entry, so id order is program (entry) order on each thread.
"""

from __future__ import annotations

from bisect import insort
from typing import Callable, Union
from operator import attrgetter
from sys import intern
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from chakra_hooks.common.errors import TraceFormatError, json_kind
from chakra_hooks.linker.pytorch import et_nodes as pytorch_et_nodes
from chakra_hooks.linker.jsonio import decode, map_bytes
from chakra_hooks.linker.pytorch.et_nodes import (NULL, EtNode, IORaw, StdAttr, StdRfId, StdScope,
                                                 StdSeqId, StdTid, as_json)

KNOWN_SCHEMAS = ("1.0.1", "1.0.2", "1.0.3", "1.0.4", "1.1.0", "1.1.1")
USER_SCOPE = 7  # RecordScope::USER_SCOPE: record_function annotations and the ET roots
_THREAD_ROOT = "[pytorch|profiler|execution_"  # the name of a per-thread root node
_STANDARD_ATTRS = frozenset(("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid",
                             "op_schema", "kernel_backend", "kernel_file", "tensor_range"))
_STANDARD_LENGTHS = (7, 10)
_STANDARD_LAST = ("op_schema", "tensor_range")


class EtAttr(msgspec.Struct, gc=False):
    name: str
    value: object = None


_IO_LISTS_DECODER = msgspec.json.Decoder(list[Union[IORaw, None]])
_ATTRS_DECODER = msgspec.json.Decoder(list[EtAttr])
_ATTR_LISTS_DECODER = msgspec.json.Decoder(list[list[EtAttr]])


_STD_VALUED = {StdRfId: "rf_id", StdSeqId: "seq_id", StdScope: "scope", StdTid: "tid"}
_STD_OTHERS = tuple(type(f"_Std_{n}", (StdAttr,), {}, tag=n) for n in sorted(
    _STANDARD_ATTRS - set(_STD_VALUED.values())))
_STD_LAST = tuple(t for t in _STD_OTHERS if t.__struct_config__.tag in _STANDARD_LAST)
_STD_UNION = Union[tuple(_STD_VALUED) + _STD_OTHERS]  # type: ignore[misc]
_STD_LISTS_DECODER = msgspec.json.Decoder(list[list[_STD_UNION]])  # type: ignore[valid-type]
CHUNK = 1024  # nodes whose attrs (or inputs / outputs) are decoded in one call


class _EtDoc(msgspec.Struct):
    # (Spelled through the module: msgspec evaluates this annotation in this module's
    # globals, where the compiled build has no `EtNode`: pytorch/et.pxd cimports it.)
    nodes: list[pytorch_et_nodes.EtNode] | None = None
    schema: object = ""
    pid: object = None
    time: object = ""


_DECODER = msgspec.json.Decoder(_EtDoc)


class _EtNodeStd(EtNode, gc=False):
    """An EtNode whose attrs hold the standard attrs only: decoded with the file, as the
    tagged union, instead of kept raw and decoded again (the usual case, one pass less)."""

    attr_raw: list[_STD_UNION] | None = msgspec.field(default=None, name="attrs")  # type: ignore[valid-type]


class _EtDocStd(_EtDoc):
    nodes: list[_EtNodeStd] | None = None


_STD_DECODER = msgspec.json.Decoder(_EtDocStd)


@dataclass(slots=True)
class HostEt:
    path: Path
    schema: str
    pid: int | None
    time: str
    nodes: list[EtNode]  # sorted by id
    by_id: dict[int, EtNode]
    raw_bytes: int
    warnings: list[str] = field(default_factory=list)

    roots: set[int] = field(default_factory=set)  # ids of the process and thread roots

    def release_raw(self, text: list[EtNode], decoded: list[EtNode]) -> None:
        """Free the file's bytes: ``text`` nodes keep their inputs / outputs as JSON text,
        ``decoded`` nodes as values; every other node loses them. Until this is called,
        every node can still read its own."""
        _keep_texts([node for node in text if node.cached_text is None])
        for node in decoded:
            node.keep_io(False, True)
        _drop_raws(self.nodes)

    def recover_io(self, nodes: list[EtNode]) -> None:
        """Give ``nodes`` their inputs / outputs as JSON text again after release_raw, by
        reading the file a second time: needed only when linking finds top-level ops that the
        ET's nesting hid (PytorchLinker._promote_escaped), so the usual conversion never
        holds the file's bytes beside Kineto's events."""
        again = read_host_et(self.path).by_id
        for node in nodes:
            source = again.get(node.id)
            if source is not None and node.cached_text is None:
                node.cached_text = (source.io_text(), source.io_text(outputs=True))

    def thread_roots(self) -> list[EtNode]:
        by_id = self.by_id
        return [by_id[i] for i in sorted(self.roots) if by_id[i].parent != i]


def _drop_raws(nodes: list[EtNode]) -> None:
    """Let every node's raw inputs / outputs go (its slices of the file's bytes)."""
    null = NULL
    for node in nodes:
        node.raw_inputs = node.raw_outputs = null
        # The flat 1.0.1 layout only (1.0.2+ keeps shapes and types inside inputs).
        if node.input_shapes is not null or node.output_shapes is not null:
            node.input_shapes = node.input_types = null
            node.output_shapes = node.output_types = null


def _keep_texts(nodes: list[EtNode]) -> None:
    """``keep_io(True, False)`` on each node, the 1.0.2+ inputs / outputs objects of CHUNK
    nodes decoded in one call (a call each cost more than the decoding); a chunk holding
    anything else (the flat 1.0.1 layout) goes node by node."""
    for lo in range(0, len(nodes), CHUNK):
        part = nodes[lo:lo + CHUNK]
        raws = []
        for node in part:
            raws.append(node.raw_inputs)
            raws.append(node.raw_outputs)
        try:
            ios = _IO_LISTS_DECODER.decode(b"[%b]" % b",".join(raws))
        except (msgspec.MsgspecError, UnicodeDecodeError):
            for node in part:
                node.keep_io(True, False)
            continue
        # None: no inputs (or outputs) member at all, io_text decides
        texts = [None if io is None else as_json(io.values, io.shapes, io.types) for io in ios]
        for index, node in enumerate(part):
            inputs, outputs = texts[2 * index], texts[2 * index + 1]
            if inputs is None or outputs is None:
                node.keep_io(True, False)
            else:
                node.cached_text = (inputs, outputs)


def _finish_node(node: EtNode, index: int, path: Path) -> None:
    """Normalise one decoded node: parent id, and the attrs list of 1.0.2+ into fields.
    (read_host_et inlines the common case; this is the reference and the slow path.)"""
    parent = node.ctrl_deps if node.ctrl_deps is not None else node.parent
    if type(parent) is not int:
        raise TraceFormatError(path, f"nodes[{index}] (id {node.id})",
                               "an integer parent id ('ctrl_deps' or 'parent')")
    node.parent = parent
    node.attrs = _NO_ATTRS
    node.name = intern(node.name)
    raw = node.attr_raw
    if raw is NULL:
        return
    node.attr_raw = NULL
    _set_attrs(node, _decode_attrs(raw, node, index, path))


def _decode_attrs(raw: msgspec.Raw, node: EtNode, index: int, path: Path) -> list[EtAttr]:
    # Attrs are decoded node by node (not with the whole file), so their objects are freed
    # at once: on a 1 GB ET they would otherwise be the largest thing in memory.
    try:
        return _ATTRS_DECODER.decode(raw)
    except (msgspec.MsgspecError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, f"nodes[{index}] (id {node.id})",
                               f"an attrs list of {{name, type, value}} ({exc})") from exc


def _set_attrs(node: EtNode, attr_list: list[EtAttr]) -> None:
    if (len(attr_list) in _STANDARD_LENGTHS and attr_list[0].name == "rf_id"
            and attr_list[2].name == "seq_id" and attr_list[3].name == "scope"
            and attr_list[4].name == "tid"
            and attr_list[-1].name in _STANDARD_LAST):
        # The layout torch writes for ordinary ops (rf_id, fw_parent, seq_id, scope, tid,
        # fw_tid, op_schema[, kernel_backend, kernel_file, tensor_range]): no dict needed.
        node.rf_id = attr_list[0].value or 0
        node.seq_id = attr_list[2].value
        node.scope = attr_list[3].value
        node.tid = attr_list[4].value
        return
    attrs = {a.name: a.value for a in attr_list}
    node.rf_id = attrs.pop("rf_id", 0) or 0
    node.seq_id = attrs.pop("seq_id", -1)
    node.tid = attrs.pop("tid", 0)
    node.scope = attrs.pop("scope", 0)
    if not attrs.keys() <= _STANDARD_ATTRS:
        node.attrs = {k: v for k, v in attrs.items() if k not in _STANDARD_ATTRS}


def _finish_nodes(nodes: list[EtNode], path: Path) -> None:
    """_finish_node on every node, its common case inlined (this loop runs once per node of
    the file: call overhead and attribute lookups are most of its time). Attrs lists not
    decoded with the file (_EtNodeStd) are decoded CHUNK nodes at a time, in one decoder call
    per chunk (their slices joined)."""
    null, no_attrs = NULL, _NO_ATTRS
    names: dict[str, str] = {}  # name -> the interned name (a dict hit costs less than intern)
    decoded = bool(nodes) and type(nodes[0]) is _EtNodeStd
    for lo in range(0, len(nodes), CHUNK):
        part = nodes[lo:lo + CHUNK]
        lists, std = None, True  # this chunk's attrs lists when decoded here, and their kind
        if not decoded:
            raws = [n.attr_raw for n in part if n.attr_raw is not null]
            lists = _decode_std_chunk(raws)
            if lists is None:
                lists, std = _decode_attr_chunk(part, raws, lo, path), False
        at = 0  # the next list of `lists`
        for index, node in enumerate(part, lo):
            parent = node.ctrl_deps
            if parent is None:
                parent = node.parent
            if type(parent) is not int:
                _finish_node(node, index, path)  # raises the error
            node.parent = parent
            node.attrs = no_attrs
            name = node.name
            interned = names.get(name)
            if interned is None:
                interned = names[name] = intern(name)
            node.name = interned
            attr_list = node.attr_raw
            if attr_list is null:
                continue
            node.attr_raw = null
            if lists is not None:
                attr_list = lists[at]
                at += 1
            elif not attr_list:
                continue
            if std:
                _set_std_attrs(node, attr_list)
            else:
                _set_attrs(node, attr_list)


def _set_std_attrs(node: EtNode, attr_list: list[StdAttr]) -> None:
    """_set_attrs for a list of standard attrs only (decoded as the tagged union)."""
    if (len(attr_list) in _STANDARD_LENGTHS and type(attr_list[0]) is StdRfId
            and type(attr_list[2]) is StdSeqId and type(attr_list[3]) is StdScope
            and type(attr_list[4]) is StdTid and type(attr_list[-1]) in _STD_LAST):
        # locals typed in et.pxd: their values are read as C members (layouts.pxd)
        rf, seq, scope, tid = attr_list[0], attr_list[2], attr_list[3], attr_list[4]
        node.rf_id = rf.value or 0
        node.seq_id = seq.value
        node.scope = scope.value
        node.tid = tid.value
        return
    # Any other order: as _set_attrs' dict (the last of a repeated name wins).
    found = {"rf_id": 0, "seq_id": -1, "tid": 0, "scope": 0}
    for attr in attr_list:
        name = _STD_VALUED.get(type(attr))
        if name is not None:
            found[name] = attr.value
    node.rf_id = found["rf_id"] or 0
    node.seq_id, node.tid, node.scope = found["seq_id"], found["tid"], found["scope"]


def _decode_std_chunk(raws: list[msgspec.Raw]) -> list[list[StdAttr]] | None:
    """The attrs lists when all of them hold standard attrs only, else None."""
    if not raws:
        return []
    try:
        return _STD_LISTS_DECODER.decode(b"[%b]" % b",".join(raws))
    except (msgspec.MsgspecError, UnicodeDecodeError):
        return None


def _decode_attr_chunk(part: list[EtNode], raws: list[msgspec.Raw], lo: int, path: Path
                       ) -> list[list[EtAttr]]:
    """The attrs lists (``raws``) of the nodes in ``part`` that have one, in order."""
    null = NULL
    if not raws:
        return []
    try:
        return _ATTR_LISTS_DECODER.decode(b"[%b]" % b",".join(raws))
    except (msgspec.MsgspecError, UnicodeDecodeError):
        for index, node in enumerate(part, lo):  # find the node, and raise its error
            if node.attr_raw is not null:
                _decode_attrs(node.attr_raw, node, index, path)
        raise


_NO_ATTRS: dict = {}
_ID = attrgetter("id")


def read_host_et(path: Path) -> HostEt:
    """Read a PyTorch host ET; raises TraceFormatError for anything that is not one."""
    path = Path(path)
    raw = map_bytes(path)
    try:  # the common layout, attrs decoded in the same pass (see _EtNodeStd)
        doc = _STD_DECODER.decode(raw)
    except (msgspec.MsgspecError, UnicodeDecodeError):  # other attrs, or a bad file (then decode names the problem)
        doc = decode(path, raw, _DECODER)
    if doc.nodes is None:
        raise TraceFormatError(path, "top level", "a PyTorch execution trace with a 'nodes' list")
    nodes = doc.nodes
    if not nodes:
        raise TraceFormatError(path, "nodes", "at least one node (the trace is empty)")
    _finish_nodes(nodes, path)
    nodes.sort(key=_ID)
    by_id = {}
    for node in nodes:  # plain loops, not comprehensions: the compiled build types `node`
        by_id[node.id] = node
    get = by_id.get
    roots = set()
    orphans = []
    for node in nodes:  # id order, so children lists come out in program order
        if node.parent == node.id or node.name.startswith(_THREAD_ROOT):
            roots.add(node.id)  # the process root is its own parent
        parent = get(node.parent) if type(node.parent) is int else None  # else: _check_tree
        if parent is not None and parent is not node:
            children = parent.children
            if children:
                children.append(node)
            else:  # leaves (most nodes) share the empty tuple: no list each
                parent.children = [node]
        elif parent is None and type(node.parent) is int:
            orphans.append(node)
    rehung = _rehang_orphans(orphans, roots, by_id) if orphans else 0
    _check_tree(nodes, roots, get, path)
    schema = str(doc.schema)
    pid = doc.pid
    et = HostEt(path, schema, pid if type(pid) is int else None, str(doc.time), nodes, by_id,
                len(raw), roots=roots)
    if rehung:
        et.warnings.append(
            f"{path}: {rehung} nodes name a parent the ET does not hold (the observer writes an "
            "op when it ends, and an async collective's range ends on another thread, or "
            "after the trace stopped): hung from their thread's root")
    if not schema.startswith(KNOWN_SCHEMAS):
        et.warnings.append(f"{path}: schema {schema!r} is not one of {', '.join(KNOWN_SCHEMAS)}; "
                           "read as the closest known layout")
    return et


def _rehang_orphans(orphans: list[EtNode], roots: set[int], by_id: dict) -> int:
    """Nodes whose parent id names no node hang from the root of their thread (the process
    root where the thread has none), in id order among its children; returns how many.
    torch's observer writes a node when its op ends: under DDP a gloo collective's range is
    opened by the calling thread and closed by gloo's, and the ops the ET nested in it can
    outlive it in the file. Their times come from Kineto, so nothing else of them is lost."""
    thread_roots: dict = {}
    process_root = None
    for root_id in sorted(roots):
        root = by_id[root_id]
        if root.parent == root_id:
            process_root = root
        else:
            thread_roots.setdefault(root.tid, root)
    rehung = 0
    for node in orphans:
        root = thread_roots.get(node.tid, process_root)
        if root is None:
            continue  # _check_tree refuses the file, naming the node
        node.parent = root.id
        if root.children:
            insort(root.children, node, key=_ID)
        else:
            root.children = [node]
        rehung += 1
    return rehung


def _check_tree(nodes: list[EtNode], roots: set[int], get: Callable, path: Path) -> None:
    """Every node must hang from a root: a duplicate id, a node that is its own parent (only
    the process root is), a loop of parents, or a parent that names no node in an ET without
    a root to hang it from (_rehang_orphans) would drop ops silently (the 19.6 s op of
    a100_simple_add, with the span). Refused in one line."""
    previous = None
    for node in nodes:  # sorted by id
        parent, tid = node.parent, node.tid
        if parent is not None and type(parent) is not int:
            _refuse_number(path, node, "ctrl_deps", parent)
        if tid is not None and type(tid) is not int:
            _refuse_number(path, node, "tid", tid)
        if not 0 <= node.id < 1 << 63:  # a Chakra node id is a uint64, ours int64 attributes
            raise TraceFormatError(path, f"node {str(node.id)[:30]} ({str(node.name)[:60]!r})",
                                   "id: an integer from 0 to 2^63")
        if node.id == previous:
            raise TraceFormatError(path, f"nodes (id {node.id})",
                                   f"unique node ids; {node.id} names two nodes")
        previous = node.id
        if node.parent == node.id and not node.name.startswith(_THREAD_ROOT):
            raise TraceFormatError(path, f"node {node.id} ({node.name[:60]!r})",
                                   "a parent other than itself (only the process root is its own)")
    seen = set()
    stack = [get(i) for i in roots]
    while stack:
        node = stack.pop()
        if node is None or node.id in seen:
            continue
        seen.add(node.id)
        children = node.children
        if children:
            stack.extend(children)
    if len(seen) == len(nodes):
        return
    for node in nodes:
        if node.id in seen:
            continue
        if get(node.parent) is None:
            expected = f"a parent that is a node of the ET (parent {node.parent} is none)"
        elif node.parent == node.id:
            expected = "a parent other than itself (only the process root is its own)"
        else:
            expected = f"a chain of parents that reaches a thread root (parent {node.parent} loops)"
        raise TraceFormatError(path, f"node {node.id} ({node.name[:60]!r})", expected)


def _refuse_number(path: Path, node: EtNode, name: str, value: object) -> None:
    raise TraceFormatError(path, f"node {node.id} ({str(node.name)[:60]!r})",
                           f"{name}: a number, got {json_kind(value)}")


def tensor_bytes(value: object) -> int:
    """Bytes of the tensors in an ET value: a tensor is ``[id, storage, offset, numel, itemsize,
    device]``; lists of tensors (any depth) are summed; anything else counts 0."""
    if not isinstance(value, list) or not value:
        return 0
    if (len(value) == 6 and type(value[3]) is int and type(value[4]) is int
            and isinstance(value[5], str)):
        return value[3] * value[4]
    return sum(tensor_bytes(v) for v in value if isinstance(v, list))
