"""The struct a PyTorch host ET node is decoded into, with its inputs / outputs helpers
(read by linker/pytorch/et.py).

It lives apart from the reader so that compiled modules, the reader included, can read and
write an :class:`EtNode`'s fields directly in C (linker/pytorch/layouts.pxd declares its memory
layout: a msgspec struct keeps its fields in fixed slots, like ``__slots__``); a module cannot
declare the layout of a class it defines itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgspec

try:  # read by Cython when it compiles this module (setup.py): see as_json
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

if not cython.compiled:
    # A copy of a raw slice's bytes: the compiled build has its own (et_nodes.pxd), through
    # the buffer protocol, without bytes()' dispatch (two thirds of each copy).
    _copy_bytes = bytes


@dataclass(slots=True)
class EtIO:
    """Inputs or outputs of one ET node, as the ET has them."""

    values: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    types: list = field(default_factory=list)


_COMPILED = cython.compiled  # (a C constant compiled; a global read in plain Python)
NULL = msgspec.Raw(b"null")
_GPU_RE = re.compile(rb'"(?:cuda|hip)')


class IORaw(msgspec.Struct):
    """A 1.0.2+ inputs / outputs object, its members left as raw JSON."""

    values: msgspec.Raw = NULL
    shapes: msgspec.Raw = NULL
    types: msgspec.Raw = NULL


_IO_DECODER = msgspec.json.Decoder(IORaw)
# Any JSON value, by a decoder made once: msgspec.json.decode sets one up per call (about
# 40 % of decoding a node's small inputs list).
_decode = msgspec.json.Decoder().decode


def _internal(name: str, default: object = None) -> object:
    """A struct field no JSON key can fill (set by the reader)."""
    return msgspec.field(default=default, name="chakra_hooks.internal." + name)


# The standard attrs (et.py's _STANDARD_ATTRS) as a union tagged by "name": decoding one
# builds no name string, and skips the values never read (op_schema, kernel_file...). A chunk
# of nodes with any other attr fails that decoder and is decoded as EtAttr lists instead.
# They live here, not in et.py, so that layouts.pxd can declare the four that carry a value
# for et.py's compiled build (a module cannot declare its own classes as extern).
class StdAttr(msgspec.Struct, tag_field="name", gc=False):
    pass


class StdRfId(StdAttr, tag="rf_id"):
    value: object = None


class StdSeqId(StdAttr, tag="seq_id"):
    value: object = None


class StdScope(StdAttr, tag="scope"):
    value: object = None


class StdTid(StdAttr, tag="tid"):
    value: object = None


class EtNode(msgspec.Struct, gc=False):
    """One ET node, decoded straight from either layout.

    ``inputs`` / ``outputs`` stay raw JSON until first read (most nodes are never looked at
    closely: only top-level ops and collectives are), then are decoded once and cached.
    """

    id: int
    name: str
    ctrl_deps: object = None  # 1.0.2+: the parent id
    parent: object = None  # 1.0.1: the parent id (set to the parent id for both layouts)
    rf_id: object = 0
    seq_id: object = -1  # autograd sequence number: a forward op and its backward node share it
    tid: object = 0
    scope: object = 0
    raw_inputs: msgspec.Raw = msgspec.field(default=NULL, name="inputs")
    raw_outputs: msgspec.Raw = msgspec.field(default=NULL, name="outputs")
    input_shapes: msgspec.Raw = NULL
    input_types: msgspec.Raw = NULL
    output_shapes: msgspec.Raw = NULL
    output_types: msgspec.Raw = NULL
    attr_raw: msgspec.Raw = msgspec.field(default=NULL, name="attrs")
    # Written by the reference linker (chakra_trace_link) into "host + device" ETs: Kineto
    # times in microseconds, and for the GPU nodes it adds, their category and stream.
    ts: object = None
    inclusive_dur: object = None
    cat: object = None
    stream: object = None
    attrs: object = _internal("attrs")  # non-standard attrs by name (collective_name, ...)
    children: object = _internal("children", ())  # a list once the node has one
    cached_in: object = _internal("cached_in")
    cached_out: object = _internal("cached_out")
    cached_text: object = _internal("cached_text")  # ((in values, shapes, types), (out ...)): as_json

    @property
    def inputs(self) -> EtIO:
        if self.cached_in is None:
            self.cached_in = _io(self.raw_inputs, self.input_shapes, self.input_types)
        return self.cached_in

    @property
    def outputs(self) -> EtIO:
        if self.cached_out is None:
            self.cached_out = _io(self.raw_outputs, self.output_shapes, self.output_types)
        return self.cached_out

    def io_text(self, outputs: bool = False) -> tuple[bytes, bytes, bytes]:
        """(values, shapes, types) as the JSON text the file has (bytes: see :func:`as_json`),
        without decoding values."""
        if self.cached_text is not None:
            return self.cached_text[outputs]
        raw = self.raw_outputs if outputs else self.raw_inputs
        if memoryview(raw)[:1] == b"{":  # 1.0.2+: slice the three members out of the object
            io = _IO_DECODER.decode(raw)
            parts = (io.values, io.shapes, io.types)
        elif outputs:
            parts = (raw, self.output_shapes, self.output_types)
        else:
            parts = (raw, self.input_shapes, self.input_types)
        return as_json(*parts)

    def tensor_ids(self, outputs: bool = False) -> list[int]:
        """Ids of the tensors among the inputs (or outputs), in order (see
        :func:`collect_tensor_ids`). The values are decoded from their JSON text (from the
        kept text when there is one): a third cheaper than finding tensors in the text by a
        regular expression."""
        if self.cached_text is not None:
            text = self.cached_text[outputs][0]
            if _COMPILED and type(text) is bytes:  # read from the text, not decoded
                found = _scan_tensor_ids(text)
                if found is not None:
                    return found
            values = _decode(text)
        else:
            values = _decode(self.raw_outputs if outputs else self.raw_inputs)
            if isinstance(values, dict):  # 1.0.2+: {values, shapes, types, strides}
                values = values.get("values")
        found: list[int] = []
        collect_tensor_ids(values, found)
        return found

    def on_gpu(self) -> bool:
        """Whether any input tensor lives on a CUDA / HIP device."""
        values = self.cached_text[0][0] if self.cached_text is not None else self.raw_inputs
        return _GPU_RE.search(values) is not None

    def keep_io(self, text: bool, decoded: bool) -> None:
        """Copy out what will be read of the inputs / outputs before the raw file goes."""
        if text and self.cached_text is None:
            self.cached_text = (self.io_text(), self.io_text(outputs=True))
        if decoded:
            _ = self.inputs, self.outputs


def _io(raw: msgspec.Raw, shapes: msgspec.Raw, types: msgspec.Raw) -> EtIO:
    loads = _decode
    value = loads(raw)
    if isinstance(value, dict):  # 1.0.2+: {values, shapes, types, strides}
        return EtIO(value.get("values", []), value.get("shapes", []), value.get("types", []))
    return EtIO(value or [], loads(shapes) or [], loads(types) or [])


def as_json(values: msgspec.Raw, shapes: msgspec.Raw, types: msgspec.Raw
            ) -> tuple[bytes, bytes, bytes]:
    """An IO's (values, shapes, types) as the JSON text the file has, copied out of the file's
    bytes; a member the ET leaves out is ``[]``. Kept as bytes, not str: the writer puts
    these bytes in the Chakra node as they are (a str would be decoded here and encoded again
    there), and a bytes object is smaller than the str."""
    null = NULL
    return (_copy_bytes(values) if values is not null else b"[]",
            _copy_bytes(shapes) if shapes is not null else b"[]",
            _copy_bytes(types) if types is not null else b"[]")


def _scan_tensor_ids(data: bytes) -> list[int] | None:
    """``collect_tensor_ids`` of the JSON value ``data``, read from its text (the compiled
    build's, on C bytes: et_nodes.pxd), without the nested lists its decoding makes (they and
    their freeing were four fifths of ``tensor_ids``). A list is a tensor when it closes: its
    id then replaces the ids found inside it, as the walk, which does not enter a tensor,
    would have them. None for a text it does not read: a top-level value that is no list, a
    byte beyond ASCII or a control byte in a string, an integer of more than 18 digits in a
    tensor's place 0, lists nested deeper than 64, a text that ends early; the caller
    decodes those. The text's JSON syntax has been checked by the ET's decoder (not its UTF-8,
    which decoding checks: hence no byte beyond ASCII here)."""
    text = data  # (compiled: its bytes through a C pointer)
    end = len(data)
    # per open list: its mark in out, count, flags, id (a C array, et_nodes.pxd: only the
    # compiled build runs this function)
    stack = _FRAMES
    out: list[int] = []
    depth = 0  # open lists
    nested = 0  # open lists and objects inside an object (skipped: the walk ignores objects)
    at = _skip_space(text, 0, end)
    if at >= end or text[at] != 91:  # [
        return None
    while at < end:
        byte = text[at]
        if byte in (32, 9, 10, 13, 44):  # blank, or the comma between two values
            at += 1
            continue
        if nested:
            if byte == 91 or byte == 123:  # [ {
                nested += 1
            elif byte == 93 or byte == 125:  # ] }
                nested -= 1
            elif byte == 34:  # "
                at = _string_after(text, at, end)
                if at < 0:
                    return None
                continue
            at += 1
            continue
        if byte == 93:  # ]: a list closes (the outermost is open: the loop returns when it closes)
            depth -= 1
            top = 4 * depth
            if stack[top + 1] == 6 and stack[top + 2] == 7:  # a tensor: its id, not its items'
                del out[stack[top]:]
                out.append(stack[top + 3])
            at += 1
            if depth == 0:
                return out if _skip_space(text, at, end) == end else None
            continue
        # a value: an item of the innermost list (or, first, the outermost list itself)
        if depth:
            top = 4 * (depth - 1)
            place = stack[top + 1]
            stack[top + 1] = place + 1
        if byte == 91:  # [
            if depth == 64:
                return None
            top = 4 * depth
            stack[top] = len(out)
            stack[top + 1] = stack[top + 2] = stack[top + 3] = 0
            depth += 1
            at += 1
        elif byte == 123:  # {
            nested = 1
            at += 1
        elif byte == 34:  # "
            if depth and place == 5:
                stack[top + 2] |= 4
            at = _string_after(text, at, end)
            if at < 0:
                return None
        elif byte == 45 or 48 <= byte <= 57:  # - 0-9
            start = at
            negative = byte == 45
            if negative:
                at += 1
            digits = 0
            value = 0
            while at < end and 48 <= text[at] <= 57:
                if digits < 18:
                    value = value * 10 + (text[at] - 48)
                digits += 1
                at += 1
            whole = digits > 0
            while at < end and text[at] in (46, 101, 69, 43, 45) or (
                    at < end and 48 <= text[at] <= 57):  # . e E + - and digits: a float
                whole = False
                at += 1
            if at == start + negative:
                return None
            if whole and depth:
                if place == 0:
                    if digits > 18:
                        return None
                    stack[top + 2] |= 1
                    stack[top + 3] = -value if negative else value
                elif place == 3:
                    stack[top + 2] |= 2
        elif byte == 116 or byte == 102 or byte == 110:  # true false null
            while at < end and 97 <= text[at] <= 122:
                at += 1
        else:
            return None
    return None


def _skip_space(text: bytes, at: int, end: int) -> int:
    """The place of the first byte from ``at`` on that is not JSON blank (``end`` if none)."""
    while at < end and text[at] in (32, 9, 10, 13):
        at += 1
    return at


def _string_after(text: bytes, at: int, end: int) -> int:
    """The place after the JSON string that starts at ``at`` (its opening quote); -1 for a
    byte beyond ASCII or a control byte in it, or no closing quote."""
    at += 1
    while at < end:
        byte = text[at]
        if byte == 34:
            return at + 1
        if byte == 92:  # a backslash: the next byte is escaped
            at += 2
            continue
        if byte >= 128 or byte < 32:
            return -1
        at += 1
    return -1


def collect_tensor_ids(value: object, out: list[int]) -> None:
    """Append the ids of the tensors in an ET value: a tensor is ``[id, storage, offset, numel,
    itemsize, device]`` (as et.tensor_bytes reads it); lists of values are searched
    at any depth."""
    if type(value) is not list or not value:
        return
    if (len(value) == 6 and type(value[0]) is int and type(value[3]) is int
            and type(value[5]) is str):
        out.append(value[0])
        return
    for item in value:
        if type(item) is list:
            collect_tensor_ids(item, out)
