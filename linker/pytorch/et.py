"""PyTorch host execution trace (ET) reader: every schema from ``1.0.1`` to ``1.1.1-chakra.1.0.0``.

Two layouts exist and both are read into the same :class:`EtNode`:

- ``1.0.1`` (and the ``execution_graph`` era): flat keys ``parent``, ``rf_id``, ``tid``,
  ``scope``, ``inputs`` (a list of values), ``input_shapes``, ``input_types``, ``outputs``...
- ``1.0.2`` and later: ``ctrl_deps`` (the parent id), ``inputs`` / ``outputs`` as
  ``{values, shapes, types, strides}`` and ``attrs`` as ``[{name, type, value}]``.

The file is decoded once, by msgspec into typed structs (tensor values stay raw slices until
a node's inputs are read; ``attrs`` lists are decoded CHUNK nodes per call, as a union tagged
by name when they hold the standard attrs only). The compiled build reads the standard attrs'
values from the lists' text instead (:func:`_scan_std_chunk`), and decodes only the chunks
that reading declines. Nodes are returned sorted by id: ids are
given at op entry, so id order is program (entry) order on each thread.
"""

from __future__ import annotations

from array import array
from bisect import insort
from typing import Callable, Union
from operator import attrgetter
from sys import intern
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

try:  # read by Cython when it compiles this module (setup.py): see _scan_std_chunk
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

from chakra_hooks.common.errors import TraceFormatError, json_kind
from chakra_hooks.linker.pytorch import et_nodes as pytorch_et_nodes
from chakra_hooks.linker.jsonio import decode, json_array, map_bytes
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
            ios = _IO_LISTS_DECODER.decode(json_array(raws))
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
        scanned = None  # the chunk's standard values, when read from its text (compiled)
        if not decoded:
            raws = [n.attr_raw for n in part if n.attr_raw is not null]
            if cython.compiled:
                scanned = _scan_std_chunk(raws)
            if scanned is not None:
                values = scanned  # read through a typed view in the compiled build (et.pxd)
            else:
                lists = _decode_std_chunk(raws)
                if lists is None:
                    lists, std = _decode_attr_chunk(part, raws, lo, path), False
        at = 0  # the next list of `lists` (or of `scanned`)
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
            if scanned is not None:
                node.rf_id = values[4 * at]
                node.seq_id = values[4 * at + 1]
                node.scope = values[4 * at + 2]
                node.tid = values[4 * at + 3]
                at += 1
                continue
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
        return _STD_LISTS_DECODER.decode(json_array(raws))
    except (msgspec.MsgspecError, UnicodeDecodeError):
        return None


# The standard attrs' names as _scan_std_chunk tells them apart (_std_code): the four that
# carry a value, those that end a list in torch's own order (_STANDARD_LAST), and the others.
_RF_ID, _SEQ_ID, _SCOPE, _TID, _STD_OTHER, _STD_END = 1, 2, 3, 4, 5, 6
_KEY_NAME, _KEY_TYPE, _KEY_VALUE = 1, 2, 4
_NOT_INT = -(1 << 62)  # a value that is not an integer (true, null...): beyond 18 digits
_DIGITS_MAX = 18  # an integer of up to 18 digits fits 64 bits


def _scan_std_chunk(raws: list[msgspec.Raw]) -> array | None:
    """What _set_std_attrs sets from each attrs list of ``raws`` (rf_id, seq_id, scope, tid:
    four items per list), read from their JSON text without decoding them: the compiled build
    reads it as C bytes (about 4,700 instructions for a node's 400 bytes of attrs at K=6),
    where decoding each attr into a struct, and freeing it, cost about 7,000 and held every
    node's structs at once. None where any list is not of the plain form read here (its
    objects with ``name``, ``type`` and ``value`` members only, each once, names of standard
    attrs without escapes, the four values integers of up to 18 digits): those chunks are
    decoded (_decode_std_chunk), which gives the same values for the lists read here. The
    text is JSON already checked by the decoder that sliced it out."""
    if not raws:
        return array("q")
    joined = b",".join(raws)
    text = joined  # the compiled build reads its bytes through a C pointer (et.pxd)
    out = array("q", bytes(32 * len(raws)))
    found = out  # and writes through a typed view
    end = len(joined)
    at = 0
    for index in range(len(raws)):
        at = _skip_blank(text, at, end)
        if at >= end or text[at] != 91:  # [
            return None
        at = _skip_blank(text, at + 1, end)
        count = 0
        first = third = fourth = fifth = last = 0  # the codes at places 0, 2, 3, 4 and the last
        v_first = v_third = v_fourth = v_fifth = 0
        rf_id, seq_id, scope, tid = 0, -1, 0, 0  # the last of each name, else its default
        if at < end and text[at] == 93:  # ]
            at += 1
        else:
            while True:
                at, code, value = _torch_attr_at(text, at, end, count)
                if at < 0:
                    return None
                if code <= _TID:  # one of the four: its value must be an integer
                    if value == _NOT_INT:
                        return None
                    if code == _RF_ID:
                        rf_id = value
                    elif code == _SEQ_ID:
                        seq_id = value
                    elif code == _SCOPE:
                        scope = value
                    else:
                        tid = value
                if count == 0:
                    first, v_first = code, value
                elif count == 2:
                    third, v_third = code, value
                elif count == 3:
                    fourth, v_fourth = code, value
                elif count == 4:
                    fifth, v_fifth = code, value
                last = code
                count += 1
                at = _skip_blank(text, at, end)
                if at >= end:
                    return None
                if text[at] == 44:  # ,
                    at = _skip_blank(text, at + 1, end)
                    continue
                if text[at] == 93:  # ]
                    at += 1
                    break
                return None
        if ((count == 7 or count == 10) and first == _RF_ID and third == _SEQ_ID
                and fourth == _SCOPE and fifth == _TID and last == _STD_END):
            # _set_std_attrs' reading by place (torch's own order)
            rf_id, seq_id, scope, tid = v_first, v_third, v_fourth, v_fifth
        found[4 * index] = rf_id
        found[4 * index + 1] = seq_id
        found[4 * index + 2] = scope
        found[4 * index + 3] = tid
        at = _skip_blank(text, at, end)
        if index + 1 < len(raws):
            if at >= end or text[at] != 44:
                return None
            at += 1
    if _skip_blank(text, at, end) != end:
        return None
    return out


# The two ways an attr is spelled in practice: torch's (a space after each separator) and
# compact JSON's, read by _spelled_attr_at without the general reading's checks at every byte.
_NAME_SPACED, _TYPE_SPACED, _VALUE_SPACED = b'{"name": "', b'", "type": "', b'", "value": '
_NAME_TIGHT, _TYPE_TIGHT, _VALUE_TIGHT = b'{"name":"', b'","type":"', b'","value":'


# The attrs torch writes first, in its order, each spelled whole up to its value as torch
# writes it and as compact JSON does: _torch_attr_at compares the one expected at a list's
# place in one go, where reading it part by part took four comparisons and two string scans.
_TORCH_ATTRS = ((b"rf_id", b"uint64"), (b"fw_parent", b"uint64"), (b"seq_id", b"int64"),
                (b"scope", b"uint64"), (b"tid", b"uint64"), (b"fw_tid", b"uint64"),
                (b"op_schema", b"string"))
_TORCH_SPACED = tuple(b'{"name": "%s", "type": "%s", "value": ' % attr for attr in _TORCH_ATTRS)
_TORCH_TIGHT = tuple(b'{"name":"%s","type":"%s","value":' % attr for attr in _TORCH_ATTRS)
_TORCH_COUNT = len(_TORCH_ATTRS)
# (_TORCH_CODES, each name's code as _std_code reads it, is set below _std_code.)


def _torch_attr_at(text: bytes, at: int, end: int, place: int) -> tuple[int, int, int]:
    """_attr_at for the attr at ``place`` in its list: where it is the one torch writes
    there, spelled as torch or compact JSON spells it, its value is read after one
    comparison; anything else is read by _attr_at (so is a value that reading fails)."""
    if place < _TORCH_COUNT:
        prefix = _TORCH_TIGHT[place]
        if not _starts(text, at, end, prefix):
            prefix = _TORCH_SPACED[place]
            if not _starts(text, at, end, prefix):
                return _attr_at(text, at, end)
        after, value = _attr_value_end(text, at + len(prefix), end)
        if after >= 0:
            return after, _TORCH_CODES[place], value
    return _attr_at(text, at, end)


def _attr_at(text: bytes, at: int, end: int) -> tuple[int, int, int]:
    """(place after it, its name's code, its value or _NOT_INT) of the attr object at ``at``:
    ``name``, ``type`` and ``value`` members, each once, in any order; (-1, 0, 0) for anything
    else (see _scan_std_chunk)."""
    after, code, value = _spelled_attr_at(text, at, end)  # the usual spellings first
    if after >= 0:
        return after, code, value
    # any other spelling: member by member
    if at >= end or text[at] != 123:  # {
        return -1, 0, 0
    seen = 0
    code = 0
    value = _NOT_INT
    at = _skip_blank(text, at + 1, end)
    while True:
        if at >= end or text[at] != 34:  # "
            return -1, 0, 0
        key = _key_at(text, at + 1, end)
        if key == 0 or seen & key:
            return -1, 0, 0
        seen |= key
        at = _skip_blank(text, at + (7 if key == _KEY_VALUE else 6), end)  # past the quote
        if at >= end or text[at] != 58:  # :
            return -1, 0, 0
        at = _skip_blank(text, at + 1, end)
        if at >= end:
            return -1, 0, 0
        if key == _KEY_NAME:
            if text[at] != 34:
                return -1, 0, 0
            close = _string_end(text, at + 1, end, False)
            if close < 0:
                return -1, 0, 0
            code = _std_code(text, at + 1, close)
            if code == 0:
                return -1, 0, 0
            at = close + 1
        elif key == _KEY_VALUE and text[at] != 34:
            at, value = _integer(text, at, end)
            if at < 0:
                return -1, 0, 0
        else:  # a type, or a value that is a string
            if text[at] != 34:
                return -1, 0, 0
            close = _string_end(text, at + 1, end, True)
            if close < 0:
                return -1, 0, 0
            at = close + 1
        at = _skip_blank(text, at, end)
        if at >= end:
            return -1, 0, 0
        if text[at] == 44:  # ,
            at = _skip_blank(text, at + 1, end)
            continue
        if text[at] == 125:  # }
            break
        return -1, 0, 0
    if seen != _KEY_NAME | _KEY_TYPE | _KEY_VALUE:
        return -1, 0, 0
    return at + 1, code, value


def _spelled_attr_at(text: bytes, at: int, end: int) -> tuple[int, int, int]:
    """_attr_at for an attr spelled as torch spells it or as compact JSON does (name, type,
    value in that order, the separators exactly so), without the member-by-member reading's
    checks at every byte; (-1, 0, 0) for any other spelling."""
    if _starts(text, at, end, _NAME_SPACED):
        name_sep, type_sep, value_sep = _NAME_SPACED, _TYPE_SPACED, _VALUE_SPACED
    elif _starts(text, at, end, _NAME_TIGHT):
        name_sep, type_sep, value_sep = _NAME_TIGHT, _TYPE_TIGHT, _VALUE_TIGHT
    else:
        return -1, 0, 0
    start = at + len(name_sep)
    close = _string_end(text, start, end, False)
    if close < 0:
        return -1, 0, 0
    code = _std_code(text, start, close)
    if code == 0 or not _starts(text, close, end, type_sep):
        return -1, 0, 0
    close = _string_end(text, close + len(type_sep), end, True)
    if close < 0 or not _starts(text, close, end, value_sep):
        return -1, 0, 0
    after, value = _attr_value_end(text, close + len(value_sep), end)
    if after < 0:
        return -1, 0, 0
    return after, code, value


def _attr_value_end(text: bytes, start: int, end: int) -> tuple[int, int]:
    """(place after the attr's closing brace, its value or _NOT_INT) for the value at
    ``start`` (a string, or what _integer reads), closing the attr; (-1, 0) else."""
    value = _NOT_INT
    if start < end and text[start] == 34:  # a string
        close = _string_end(text, start + 1, end, True)
        start = close + 1 if close >= 0 else -1
    elif start < end:
        start, value = _integer(text, start, end)
    if 0 <= start < end and text[start] == 125:  # }
        return start + 1, value
    return -1, 0


def _starts(text: bytes, at: int, end: int, literal: bytes) -> bool:
    """Whether text[at:end] starts with ``literal``."""
    return at + len(literal) <= end and _same_bytes(text, at, literal)


def _skip_blank(text: bytes, at: int, end: int) -> int:
    """The place of the first byte from ``at`` on that is not JSON white space."""
    while at < end:
        byte = text[at]
        if byte != 32 and byte != 10 and byte != 13 and byte != 9:
            break
        at += 1
    return at


def _string_end(text: bytes, at: int, end: int, escapes: bool) -> int:
    """The place of the quote that ends the string whose text starts at ``at``; -1 if there is
    none, or an escape where ``escapes`` is False."""
    if cython.compiled:  # memchr's pass over the bytes (et.pxd), most of the text being strings
        return _quote_at(text, at, end, escapes)
    while at < end:
        byte = text[at]
        if byte == 34:
            return at
        if byte == 92:  # a backslash: the next byte is escaped
            if not escapes:
                return -1
            at += 1
        at += 1
    return -1


def _key_at(text: bytes, start: int, end: int) -> int:
    """_KEY_NAME, _KEY_TYPE or _KEY_VALUE for the key whose text starts at ``start`` (its
    closing quote included), else 0."""
    if start + 4 < end and text[start + 4] == 34:
        if text[start] == 110 and text[start + 1] == 97 and text[start + 2] == 109 \
                and text[start + 3] == 101:  # name
            return _KEY_NAME
        if text[start] == 116 and text[start + 1] == 121 and text[start + 2] == 112 \
                and text[start + 3] == 101:  # type
            return _KEY_TYPE
    elif start + 5 < end and text[start + 5] == 34 and text[start] == 118 \
            and text[start + 1] == 97 and text[start + 2] == 108 and text[start + 3] == 117 \
            and text[start + 4] == 101:  # value
        return _KEY_VALUE
    return 0


def _std_code(text: bytes, start: int, stop: int) -> int:
    """The code of the standard attr (_STANDARD_ATTRS) named text[start:stop], else 0: by
    its length, then its bytes (a C comparison or two in the compiled build)."""
    size = stop - start
    if size == 5:
        if _same_bytes(text, start, b"rf_id"):
            return _RF_ID
        if _same_bytes(text, start, b"scope"):
            return _SCOPE
    elif size == 6:
        if _same_bytes(text, start, b"seq_id"):
            return _SEQ_ID
        if _same_bytes(text, start, b"fw_tid"):
            return _STD_OTHER
    elif size == 3:
        if _same_bytes(text, start, b"tid"):
            return _TID
    elif size == 9:
        if _same_bytes(text, start, b"fw_parent"):
            return _STD_OTHER
        if _same_bytes(text, start, b"op_schema"):
            return _STD_END
    elif size == 14:
        if _same_bytes(text, start, b"kernel_backend"):
            return _STD_OTHER
    elif size == 11:
        if _same_bytes(text, start, b"kernel_file"):
            return _STD_OTHER
    elif size == 12:
        if _same_bytes(text, start, b"tensor_range"):
            return _STD_END
    return 0


def _same_bytes(text: bytes, start: int, name: bytes) -> bool:
    """Whether ``name`` is at text[start:] (the caller knows that much text is there)."""
    if cython.compiled:  # memcmp (et.pxd), where the loop cost 6 instructions a byte
        return _bytes_at(text, start, name)
    for i in range(len(name)):
        if text[start + i] != name[i]:
            return False
    return True


_TORCH_CODES = tuple([_std_code(name, 0, len(name)) for name, _ in _TORCH_ATTRS])


def _integer(text: bytes, at: int, end: int) -> tuple[int, int]:
    """(place after, value) of the JSON value at ``at``: an integer of up to _DIGITS_MAX
    digits, or true / false / null (value _NOT_INT); (-1, 0) for anything else (a float, a
    longer integer, a list...)."""
    byte = text[at]
    if byte == 116 or byte == 110 or byte == 102:  # true, null, false
        while at < end and 97 <= text[at] <= 122:
            at += 1
        return at, _NOT_INT
    negative = byte == 45  # -
    if negative:
        at += 1
    start = at
    value = 0
    while at < end and 48 <= text[at] <= 57:
        value = value * 10 + (text[at] - 48)
        at += 1
        if at - start > _DIGITS_MAX:
            return -1, 0
    digits = at - start
    if digits == 0 or digits > 1 and text[start] == 48:
        return -1, 0
    if at < end and (text[at] == 46 or text[at] == 101 or text[at] == 69):  # . e E
        return -1, 0
    return at, -value if negative else value


def _decode_attr_chunk(part: list[EtNode], raws: list[msgspec.Raw], lo: int, path: Path
                       ) -> list[list[EtAttr]]:
    """The attrs lists (``raws``) of the nodes in ``part`` that have one, in order."""
    null = NULL
    if not raws:
        return []
    try:
        return _ATTR_LISTS_DECODER.decode(json_array(raws))
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
    if cython.compiled:  # attrs kept as text, their values read from it (_scan_std_chunk)
        doc = decode(path, raw, _DECODER)
    else:
        try:  # the common layout, attrs decoded in the same pass (see _EtNodeStd)
            doc = _STD_DECODER.decode(raw)
        except (msgspec.MsgspecError, UnicodeDecodeError):
            # other attrs, or a bad file (then decode names the problem)
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
