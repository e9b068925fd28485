"""HLO reader: the text form (``compile().as_text()``, TPU op event names) and the HloProto
bytes of an XSpace's ``/host:metadata`` plane, both into one small model.

What the linker needs from HLO: each instruction's operands (data dependencies), shapes with
byte sizes (tensor and message sizes, memory spaces for host offload), called computations
(fusions, async wrappers), async ``*-start`` / ``*-done`` pairs, and for collectives the
replica groups (explicit ``{{0,1},{2,3}}`` or iota ``[G,S]<=[dims]T(perm)``) and
``source_target_pairs``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from chakra_hooks.linker.model import MAX_RANKS
from chakra_hooks.linker.xla import hlo_pb2

# Bits per element; a shape's byte size rounds the total up to whole bytes.
DTYPE_BITS: dict[str, int] = {
    "pred": 8, "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f8e5m2": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e3m4": 8,
    "f8e5m2fnuz": 8, "f8e4m3fnuz": 8, "f4e2m1fn": 4, "f8e8m0fnu": 8,
    "token": 0, "opaque": 0,
}
# xla.PrimitiveType numbers (xla/xla_data.proto) -> text names.
PRIMITIVE_TYPES: dict[int, str] = {
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32", 9: "u64",
    10: "f16", 11: "f32", 12: "f64", 13: "tuple", 14: "opaque", 15: "c64", 16: "bf16",
    17: "token", 18: "c128", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4",
    23: "f8e4m3b11fnuz", 24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "s2", 27: "u2",
    28: "f8e4m3", 29: "f8e3m4", 30: "s1", 31: "u1", 32: "f4e2m1fn", 33: "f8e8m0fnu",
}
COLLECTIVES = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    "ragged-all-to-all", "collective-broadcast",
})


@dataclass(slots=True, frozen=True)
class Shape:
    """An array (dtype + dims), a tuple (``elements``), or a token."""

    dtype: str
    dims: tuple[int, ...] = ()
    elements: tuple["Shape", ...] = ()
    memory_space: int = 0  # layout S(n); on TPU S(5) is host memory

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def nbytes(self) -> int:
        if self.is_tuple:
            return sum(e.nbytes for e in self.elements)
        count = 1
        for d in self.dims:
            count *= d
        return (count * DTYPE_BITS.get(self.dtype, 0) + 7) // 8

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(e) for e in self.elements) + ")"
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass(slots=True)
class Instruction:
    name: str
    opcode: str
    shape: Shape
    operands: list[str] = field(default_factory=list)
    operand_shapes: list[Shape | None] = field(default_factory=list)  # inline in TPU event text
    called: list[str] = field(default_factory=list)  # called computations
    attrs: dict[str, str] = field(default_factory=dict)
    replica_groups: list[list[int]] | None = None  # None: not given; [] = all devices
    source_target_pairs: list[tuple[int, int]] = field(default_factory=list)
    channel_id: int | None = None
    is_root: bool = False


@dataclass(slots=True)
class Computation:
    name: str
    instructions: list[Instruction] = field(default_factory=list)
    is_entry: bool = False

    @property
    def root(self) -> Instruction | None:
        for inst in self.instructions:
            if inst.is_root:
                return inst
        return self.instructions[-1] if self.instructions else None


@dataclass(slots=True)
class HloModule:
    name: str
    computations: dict[str, Computation] = field(default_factory=dict)
    entry: str = ""
    source: str = ""  # "hlo proto", "hlo text", "event text"
    _by_name: dict[str, Instruction] = field(default_factory=dict)

    def add(self, comp: Computation) -> None:
        self.computations[comp.name] = comp
        for inst in comp.instructions:
            self._by_name[inst.name] = inst
        if comp.is_entry:
            self.entry = comp.name

    def instruction(self, name: str) -> Instruction | None:
        return self._by_name.get(name)

    def operand_shape(self, inst: Instruction, index: int) -> Shape | None:
        if index < len(inst.operand_shapes) and inst.operand_shapes[index] is not None:
            return inst.operand_shapes[index]
        producer = self._by_name.get(inst.operands[index])
        return producer.shape if producer else None

    def operand_bytes(self, inst: Instruction) -> int:
        return sum(s.nbytes for i in range(len(inst.operands)) if (s := self.operand_shape(inst, i)))


# ---------------------------------------------------------------------------------------------
# Text


class HloParseError(ValueError):
    """Text that is not HLO; the message names the line."""


def _unquoted(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, character, bracket depth after it) of every character outside double quotes,
    from ``start``; a backslash escapes the next character inside quotes."""
    depth = 0
    quote = False
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
        else:
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
            yield i, c, depth
        i += 1


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets and quotes."""
    parts: list[str] = []
    start = 0
    for i, c, depth in _unquoted(text):
        if c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _close(text: str, i: int) -> int:
    """Index just past the bracket that closes the one at ``text[i]``."""
    for j, c, depth in _unquoted(text, i):
        if depth == 0 and c in ")]}":
            return j + 1
    raise HloParseError(f"unbalanced bracket at column {len(text)}")


_DTYPE_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_MEMSPACE_RE = re.compile(r"S\((\d+)\)")


def parse_shape(text: str, i: int = 0) -> tuple[Shape, int]:
    """Parse one shape starting at ``text[i]``; return it and the index after it."""
    while i < len(text) and text[i] == " ":
        i += 1
    if text.startswith("(", i):
        end = _close(text, i)
        elements = tuple(parse_shape(part)[0] for part in _split_top(text[i + 1:end - 1]))
        return Shape("tuple", elements=elements), end
    if text.startswith("token", i) and not text.startswith("token[", i):
        return Shape("token"), i + 5
    m = _DTYPE_RE.match(text, i)
    if m is None:
        raise HloParseError(f"a shape at column {i}, got {text[i:i + 30]!r}")
    try:
        dims = tuple(int(d.strip().lstrip("<=")) for d in m.group(2).split(",") if d.strip())
    except ValueError:
        raise HloParseError(f"dimensions at column {i}, got {m.group(0)[:30]!r}") from None
    i = m.end()
    space = 0
    if text.startswith("{", i):
        end = _close(text, i)
        sm = _MEMSPACE_RE.search(text, i, end)
        if sm:
            space = int(sm.group(1))
        i = end
    return Shape(m.group(1), dims, memory_space=space), i


_INST_RE = re.compile(r"\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*")
_OPCODE_RE = re.compile(r"\s*([a-z][a-z0-9\-_]*)\(")
_COMMENT_RE = re.compile(r"/\*.*?\*/")
_CALL_KEYS = ("calls", "to_apply", "body", "condition", "branch_computations",
              "called_computations", "true_computation", "false_computation")


def parse_instruction(line: str) -> Instruction:
    """One instruction line: ``[ROOT] %name = SHAPE opcode(OPERANDS), key=value, ...``."""
    m = _INST_RE.match(line)
    if m is None:
        raise HloParseError(f"an instruction 'name = shape opcode(...)', got {line[:60]!r}")
    shape, i = parse_shape(line, m.end())
    om = _OPCODE_RE.match(line, i)
    if om is None:
        raise HloParseError(f"an opcode after the shape of {m.group(2)}, got {line[i:i + 30]!r}")
    open_at = om.end() - 1
    close_at = _close(line, open_at)
    inst = Instruction(name=m.group(2), opcode=om.group(1), shape=shape, is_root=bool(m.group(1)))
    if inst.opcode not in ("constant", "parameter", "iota"):
        _parse_operands(inst, _COMMENT_RE.sub("", line[open_at + 1:close_at - 1]))
    rest = line[close_at:].lstrip(", ")
    for part in _split_top(rest):
        key, eq, value = part.partition("=")
        if eq:
            inst.attrs[key.strip()] = value.strip()
    _interpret_attrs(inst)
    return inst


def _parse_operands(inst: Instruction, text: str) -> None:
    for part in _split_top(text):
        tokens = part.rsplit(None, 1)
        name = tokens[-1].lstrip("%")
        if not _NAME_RE.match(name):
            continue  # a literal, not an instruction
        shape = None
        if len(tokens) == 2:  # TPU event text: "f32[8]{0} %x"
            try:
                shape = parse_shape(tokens[0])[0]
            except HloParseError:
                shape = None
        inst.operands.append(name)
        inst.operand_shapes.append(shape)


_NAME_RE = re.compile(r"^[A-Za-z_][\w.\-]*$")


def _interpret_attrs(inst: Instruction) -> None:
    attrs = inst.attrs
    for key in _CALL_KEYS:
        value = attrs.get(key)
        if value:
            inst.called.extend(v.strip().lstrip("%") for v in value.strip("{}").split(",") if v.strip())
    if "replica_groups" in attrs:
        inst.replica_groups = parse_replica_groups(attrs["replica_groups"])
    if "source_target_pairs" in attrs:
        inst.source_target_pairs = [(g[0], g[1]) for g in parse_replica_groups(attrs["source_target_pairs"])]
    if "channel_id" in attrs:
        try:
            inst.channel_id = int(attrs["channel_id"])
        except ValueError:
            pass


_IOTA_RE = re.compile(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


def parse_replica_groups(text: str) -> list[list[int]]:
    """``{{0,1},{2,3}}``, ``{}`` (all devices: returns []), iota ``[G,S]<=[dims]T(perm)``, or
    a named mesh ``mesh['a'=2,'b'=4] {'b'}`` (newer XLA: devices 0..N-1 laid out row-major on
    the mesh; a group is every device along the named axes, the others fixed)."""
    text = text.strip()
    m = _IOTA_RE.fullmatch(text.replace(" ", ""))
    if m:
        dims = [int(d) for d in m.group(3).split(",")]
        perm = [int(p) for p in m.group(4).split(",")] if m.group(4) else list(range(len(dims)))
        return iota_groups(int(m.group(1)), int(m.group(2)), dims, perm)
    m = _MESH_RE.fullmatch(text)
    if m:
        return mesh_groups(m.group(1), m.group(2))
    inner = text[1:-1].strip() if text.startswith("{") else text
    groups: list[list[int]] = []
    for part in _split_top(inner):
        members = part.strip("{}").strip()
        try:
            groups.append([int(x) for x in members.split(",") if x.strip()])
        except ValueError:
            raise HloParseError(f"replica_groups={text}: not a form this reader knows") from None
    return groups


_MESH_RE = re.compile(r"mesh\[(.*?)\]\s*\{(.*?)\}")
_MESH_AXIS_RE = re.compile(r"'([^']*)'\s*=\s*(\d+)")


def mesh_groups(axes_text: str, listed_text: str) -> list[list[int]]:
    """The groups of ``mesh[<axes>] {<listed axes>}`` (see parse_replica_groups)."""
    axes = [(name, int(size)) for name, size in _MESH_AXIS_RE.findall(axes_text)]
    listed = [name.strip().strip("'") for name in listed_text.split(",") if name.strip()]
    names = [name for name, _ in axes]
    if not axes or any(name not in names for name in listed):
        raise HloParseError(f"replica_groups=mesh[{axes_text}] {{{listed_text}}}: axes do not fit")
    sizes = [size for _, size in axes]
    if math.prod(sizes) > MAX_RANKS:
        raise HloParseError(f"replica_groups=mesh[{axes_text}]: more than {MAX_RANKS} devices")
    strides = [1] * len(sizes)
    for k in range(len(sizes) - 2, -1, -1):
        strides[k] = strides[k + 1] * sizes[k + 1]
    inside = [names.index(name) for name in listed]
    outside = [k for k in range(len(sizes)) if k not in inside]
    groups = []
    for fixed in itertools.product(*(range(sizes[k]) for k in outside)):
        base = sum(c * strides[k] for c, k in zip(fixed, outside))
        groups.append(sorted(base + sum(c * strides[k] for c, k in zip(moving, inside))
                             for moving in itertools.product(*(range(sizes[k]) for k in inside))))
    return groups


def iota_groups(num_groups: int, group_size: int, dims: list[int], perm: list[int]) -> list[list[int]]:
    """Device ids ``0..prod(dims)-1`` reshaped to ``dims``, transposed by ``perm``, then read
    row-major into ``num_groups`` groups of ``group_size``."""
    total = 1
    for d in dims:
        total *= d
    if (total != num_groups * group_size or sorted(perm) != list(range(len(dims)))
            or total > MAX_RANKS):
        raise HloParseError(f"iota replica groups [{num_groups},{group_size}]<={dims}T{perm} do not fit")
    strides = [1] * len(dims)
    for k in range(len(dims) - 2, -1, -1):
        strides[k] = strides[k + 1] * dims[k + 1]
    tdims = [dims[p] for p in perm]
    tstrides = [strides[p] for p in perm]
    flat: list[int] = []
    index = [0] * len(tdims)
    for _ in range(total):
        flat.append(sum(i * s for i, s in zip(index, tstrides)))
        for k in range(len(tdims) - 1, -1, -1):  # odometer over the transposed dims
            index[k] += 1
            if index[k] < tdims[k]:
                break
            index[k] = 0
    return [flat[g * group_size:(g + 1) * group_size] for g in range(num_groups)]


# "ENTRY %main (p: f32[4]) -> f32[4] {", "%region_0 (...) -> f32[] {", or short "region_0 {"
_COMP_RE = re.compile(r"\s*(ENTRY\s+)?%?([^\s(=]+)\s*(\(.*\)\s*->\s*.*)?\{\s*$")


def parse_hlo_text(text: str, source: str = "hlo text") -> HloModule:
    """A whole module as printed by XLA (``HloModule name, ...`` then computations)."""
    module = HloModule(name="", source=source)
    current: Computation | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        if current is None:
            if stripped.startswith("HloModule "):
                module.name = stripped[len("HloModule "):].split(",")[0].strip()
                continue
            m = _COMP_RE.match(line)
            if m:
                current = Computation(m.group(2), is_entry=bool(m.group(1)))
            continue  # sections such as FileNames / StackFrames are skipped
        if stripped == "}":
            module.add(current)
            current = None
            continue
        try:
            current.instructions.append(parse_instruction(line))
        except (ValueError, IndexError) as err:  # HloParseError, or a number that is not one
            raise HloParseError(f"line {lineno}: {err}") from None
    if not module.computations:
        raise HloParseError("no computation found (expected 'ENTRY %name (...) -> ... {')")
    if not module.entry:
        module.entry = next(reversed(module.computations))
    return module


# ---------------------------------------------------------------------------------------------
# HloProto bytes (XSpace /host:metadata "Hlo Proto" stat)


def _shape_from_proto(p: hlo_pb2.ShapeProto) -> Shape:
    dtype = PRIMITIVE_TYPES.get(p.element_type, f"type{p.element_type}")
    if dtype == "tuple":
        return Shape("tuple", elements=tuple(_shape_from_proto(e) for e in p.tuple_shapes))
    return Shape(dtype, tuple(p.dimensions), memory_space=p.layout.memory_space)


def _groups_from_proto(p: hlo_pb2.HloInstructionProto) -> list[list[int]] | None:
    dl = p.collective_device_list
    if dl.HasField("iota_replica_group_list"):
        iota = dl.iota_replica_group_list
        return iota_groups(iota.num_replica_groups, iota.num_devices_per_group,
                           list(iota.iota_reshape_dims), list(iota.iota_transpose_perm)
                           or list(range(len(iota.iota_reshape_dims))))
    groups = dl.replica_groups or p.replica_groups
    return [list(g.replica_ids) for g in groups]


def parse_hlo_proto(data: bytes) -> HloModule:
    """Serialized ``xla.HloProto`` (or a bare ``HloModuleProto``) into an HloModule."""
    proto = hlo_pb2.HloProto()
    proto.ParseFromString(data)
    mp = proto.hlo_module
    if not mp.computations:  # maybe a bare HloModuleProto
        mp = hlo_pb2.HloModuleProto()
        mp.ParseFromString(data)
    names = {i.id: i.name for c in mp.computations for i in c.instructions}
    comp_names = {c.id: c.name for c in mp.computations}
    module = HloModule(name=mp.name, source="hlo proto")
    for cp in mp.computations:
        comp = Computation(cp.name, is_entry=(cp.id == mp.entry_computation_id if mp.entry_computation_id
                                              else cp.name == mp.entry_computation_name))
        for ip in cp.instructions:
            inst = Instruction(name=ip.name, opcode=ip.opcode, shape=_shape_from_proto(ip.shape),
                               operands=[names.get(o, str(o)) for o in ip.operand_ids],
                               called=[comp_names.get(c, str(c)) for c in ip.called_computation_ids],
                               is_root=ip.id == cp.root_id,
                               channel_id=ip.channel_id or None)
            if ip.opcode.removesuffix("-start") in COLLECTIVES:
                inst.replica_groups = _groups_from_proto(ip)
            inst.source_target_pairs = [(st.source, st.target) for st in ip.source_target_pairs]
            comp.instructions.append(inst)
        module.add(comp)
    return module


# ---------------------------------------------------------------------------------------------
# Queries used by the linker


@dataclass(slots=True, frozen=True)
class Collective:
    kind: str  # base opcode: "all-reduce", "collective-permute", ...
    size_bytes: int
    replica_groups: list[list[int]] | None
    source_target_pairs: list[tuple[int, int]]


def collective_of(module: HloModule, inst: Instruction) -> Collective | None:
    """The collective an instruction performs (sync, ``*-start``, or an ``async-start``
    wrapping one), with its message size from the operand shapes; None otherwise."""
    target = inst
    if inst.opcode == "async-start" and inst.called:
        comp = module.computations.get(inst.called[0])
        root = comp.root if comp else None
        if root is None:
            return None
        target = root
    base = target.opcode.removesuffix("-start")
    if base not in COLLECTIVES:
        return None
    if base == "ragged-all-to-all":
        shape = module.operand_shape(inst, 0) if inst.operands else None
        size = shape.nbytes if shape else 0  # the other operands are offsets and sizes
    else:
        size = module.operand_bytes(inst)
    return Collective(base, size, target.replica_groups, list(target.source_target_pairs))


def async_start_of(inst: Instruction) -> str | None:
    """For ``*-done`` (and ``async-update`` / ``async-done``), the name of its ``*-start``."""
    if (inst.opcode.endswith("-done") or inst.opcode == "async-update") and inst.operands:
        return inst.operands[0]
    return None


def host_offload_direction(module: HloModule, inst: Instruction, host_space: int = 5) -> str | None:
    """"load" (host -> device) or "store" (device -> host) for a copy-start touching host
    memory (memory space S(5)), else None."""
    if inst.opcode != "copy-start":
        return None
    dest = inst.shape.elements[0] if inst.shape.is_tuple and inst.shape.elements else inst.shape
    src = module.operand_shape(inst, 0) if inst.operands else None
    if dest.memory_space == host_space and (src is None or src.memory_space != host_space):
        return "store"
    if src is not None and src.memory_space == host_space and dest.memory_space != host_space:
        return "load"
    return None
