"""Share a converted run without giving it away: ``chakra-hooks share OUT -o SHARED/``.

A copy of the run in which every string that names the user's code or machine is a keyed
pseudonym or gone, and what a simulator and ``stats`` / ``whatif`` / ``timeline`` read is
kept: node types, times, dependencies, communication types and sizes, process groups, peers,
MoE bin counts, KV bytes.

Pseudonyms are HMAC-SHA256 of the text under the user's key (its first 48 bits, in hex, behind
a kind: ``op_`` node names, ``s_`` other strings, ``t_`` threads): the same name gets the same
pseudonym on every rank and, with the same key, in every run, so two shared runs still compare;
without the key a pseudonym cannot be turned back into its name (no table is written).

Levels (each keeps what the one before keeps):

- ``names``: node names (but ``host_gap``); string attributes (thread ids in lanes, HLO ops and
  modules, MoE module names, KV layer names...), except the format's own words (Kineto
  categories, collective names, ``stream:<device>:<stream>`` lanes, numeric process groups);
  the strings inside inputs' and outputs' values and types other than PyTorch's own; thread
  ids in ``gloo_thread``; the metadata's file names, paths, pids and notes (dropped).
- ``shapes``: also every tensor dimension, element count and offset, and every whole number
  among the inputs' and outputs' values (sizes and strides given as arguments), rounded up to
  a power of two. Communication sizes and memory nodes' bytes stay exact: a simulator needs
  them.
- ``times``: also each duration multiplied by 1 + u, u uniform in [-bound, +bound], drawn per
  node under the key (and ``seed``), and every start moved with what it waited for, so that
  no recorded duration can be read back from the starts (converter/share_times.py).

The shared ETs' metadata says the level and what was removed (names of fields, never values).
``check`` is the leak test a user runs before sending (module-level docstring of ``check``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from chakra_hooks import storage
from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.enrich.gaps import GAP_NAME
from chakra_hooks.linker.model import OpKind
from chakra_hooks.linker.pytorch.comms import classify

from . import etio, share_times
from .attrs import make_attr
from . import peers as run_peers
from .run_model import GROUPS_FILE, read_groups, read_run
from .targets.astra_sim.network import MEMORY_FILE, NETWORK_FILE, SYSTEM_FILE

LEVELS = ("names", "shapes", "times")
DEFAULT_KEY_FILE = Path("~/.chakra-hooks/share.key")
# What a conversion writes beside its ETs, and nothing else is copied.
RUN_FILES = (GROUPS_FILE, NETWORK_FILE, SYSTEM_FILE, MEMORY_FILE)

# The format's own words, kept where they stand.
KINETO_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation",
                               "cuda_runtime", "cuda_driver", "python_function"})
KV_DIRECTIONS = frozenset({"load", "store"})
XLA_LINES = frozenset({"XLA Ops", "Async XLA Ops", "XLA Modules", "Steps"})
BACKENDS = re.compile(r"^((cpu|cuda|xpu|hpu|mps):(gloo|nccl|mpi|ucc|xccl|hccl)(,\s*)?)*$")
DEVICES = re.compile(r"^(cpu|cuda|hip|mps|xla|xpu|meta|hpu|privateuseone)(:\d+)?$")
# PyTorch's type names in an ET's "types" (Tensor(float), GenericList[Int,Int], ...).
TYPE_WORDS = frozenset({
    "Tensor", "TensorList", "GenericList", "Int", "Float", "Bool", "String", "Device", "Layout",
    "ScalarType", "MemoryFormat", "Scalar", "None", "Generator", "Stream", "Storage", "Tuple",
    "Optional", "Dict", "List", "Object", "Double", "Complex", "SymInt", "SymFloat", "Dimname",
    "QScheme", "Undefined", "float", "double", "half", "bfloat16", "int", "long", "short",
    "char", "signed", "unsigned", "bool", "uint8", "int8", "int16", "int32", "int64", "float16",
    "float32", "float64", "complex", "c10", "Half", "BFloat16", "ComplexFloat", "ComplexDouble",
    "Float8_e4m3fn", "Float8_e5m2", "Byte", "Char", "Short", "Long", "ComplexHalf", "QInt8",
    "QUInt8", "QInt32", "Bits", "UInt16", "UInt32", "UInt64"})
_TYPE_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Metadata kept: strings of the format's own words, and integers but process ids.
KEPT_META_STRINGS = frozenset({"schema", "version", "clock", "match_strategy", "producer",
                               "framework", "target", "time_unit", "exact_time_unit",
                               "device_kind"})
DROPPED_META_INTS = frozenset({"pid", "kineto_pid"})
# Attributes holding times that a duration perturbation scales with the node's duration.
_DURATION_ATTRS = re.compile(r"(^|_)dur|^gap_ns$|^peer_wait_ns$|^kv_excluded_ns$")
THREAD_INT_ATTRS = frozenset({"gloo_thread"})
# Attributes whose values are the converter's own texts.
OUR_TEXT_ATTRS = {
    "comm_unresolved": frozenset({"kind or peer unknown: replayed as compute"}),
    "replayed_as_compute": frozenset({*(kind.name for kind in OpKind),
                                      "single-member process group",
                                      "no matching collective on the other ranks of the run"}),
}


class Pseudonyms:
    """Keyed, stable pseudonyms (HMAC-SHA256, 48 bits in hex) by kind."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._seen: dict[tuple[str, str], str] = {}

    def __call__(self, text: str, kind: str = "s") -> str:
        found = self._seen.get((kind, text))
        if found is None:
            digest = hmac.new(self._key, f"{kind}\0{text}".encode(), hashlib.sha256).hexdigest()
            found = self._seen[(kind, text)] = f"{kind}_{digest[:12]}"
        return found

    def number(self, value: int) -> int:
        """A thread id's pseudonym as a positive 31-bit integer."""
        digest = hmac.new(self._key, f"n\0{value}".encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF or 1


DEFAULT_KEY = Path("~/.chakra-hooks/share.key")


def load_key(path: Path, say: Callable[[str], None], new: bool = False) -> bytes:
    """The user's key from ``path``. It is made (random, 256 bits, readable by the user alone)
    where asked (``new``), or at the default place on first use; a key file given elsewhere
    that does not exist is refused (a typo would give other pseudonyms, and two runs shared
    with them would no longer compare)."""
    default = path == DEFAULT_KEY
    path = path.expanduser()
    if path.exists() and new:
        raise TraceFormatError(path, "key", "no key yet (--new-key makes one; this file holds "
                               "one already: leave --new-key out to use it)")
    if not path.exists() and not (new or default):
        raise TraceFormatError(path, "key", "an existing key file (--new-key makes one there)")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
        say(f"created the key {path}: keep it (and never send it); runs shared with it get the "
            "same pseudonyms")
    else:
        say(f"using the key {path}")
    text = path.read_text().strip()
    if len(text) < 32:
        raise TraceFormatError(path, "key", "a key of at least 32 characters (the file "
                               "`share` makes holds 64 hex digits)")
    return text.encode()


@dataclass
class Options:
    level: str = "names"
    bound: float = 0.0  # times: the relative bound of the duration noise
    seed: int = 0


@dataclass
class Removed:
    """What the sharing took out, by field name (the shared metadata lists them)."""

    metadata: set[str] = field(default_factory=set)
    attrs: set[str] = field(default_factory=set)
    io: set[str] = field(default_factory=set)

    def describe(self, level: str) -> str:
        parts = ["node names (pseudonyms; host_gap kept)"]
        if self.attrs:
            parts.append("string attributes " + ", ".join(sorted(self.attrs)) + " (pseudonyms)")
        if self.io:
            parts.append("strings in inputs/outputs " + ", ".join(sorted(self.io)) + " (pseudonyms)")
        if self.metadata:
            parts.append("metadata " + ", ".join(sorted(self.metadata)) + " (dropped)")
        if level in ("shapes", "times"):
            parts.append("tensor shapes and element counts (rounded up to powers of two)")
        if level == "times":
            parts.append("durations (perturbed)")
        return "; ".join(parts)


# ------------------------------------------------------------------------------- strings


def _lane(lane: str, names: Pseudonyms) -> str:
    """A lane with its thread pseudonymised and the format's words kept."""
    kind, sep, rest = lane.partition(":")
    if not sep:
        return lane if lane in ("host", "device") else names(lane)
    if kind == "stream":  # stream:<device>:<stream>; an XLA line's name where no number
        device, _, stream = rest.partition(":")
        return (f"stream:{device if device.lstrip('-').isdigit() else names(device)}:"
                f"{stream if stream.lstrip('-').isdigit() else names(stream)}")
    if kind == "thread":
        return f"thread:{names(rest, 't')}"
    if kind == "comm":
        return lane if rest == "default" or rest.isdigit() else f"comm:{names(rest)}"
    if kind == "tpu":
        ordinal, _, line = rest.partition(":")
        return lane if line in XLA_LINES and ordinal.isdigit() else f"tpu:{ordinal}:{names(line)}"
    if kind in ("cpu", "engine_step") and rest.isdigit():
        return lane
    if kind == "moe_routing" and re.fullmatch(r"layer\d+", rest):
        return lane
    return f"{names(kind)}:{names(rest)}"


def _pg_name(value: str, names: Pseudonyms) -> str:
    return value if value.isdigit() or value in ("", "default") else names(value)


def _pg_config(text: str, names: Pseudonyms) -> str:
    try:
        groups = orjson.loads(text)
    except orjson.JSONDecodeError:
        return names(text)
    if not isinstance(groups, list):
        return names(text)
    out = []
    for group in groups:
        if not isinstance(group, dict):
            continue
        kept = {}
        for key, value in group.items():
            if key in ("pg_size", "ranks") and not isinstance(value, str):
                kept[key] = value
            elif key == "pg_name" and isinstance(value, str):
                kept[key] = _pg_name(value, names)
            elif key == "backend_config" and isinstance(value, str) and BACKENDS.match(value):
                kept[key] = value
            elif isinstance(value, str):
                kept[key] = names(value)
        out.append(kept)
    return orjson.dumps(out).decode()


def string_attr(name: str, value: str, names: Pseudonyms) -> str:
    """A string attribute's shared value (the original when it is the format's own word)."""
    if name in ("lane", "calling_lane"):
        return _lane(value, names)
    if name == "category" and value in KINETO_CATEGORIES:
        return value
    if name == "collective" and classify(value) is not None:
        return value
    if name == "pg_name":
        return _pg_name(value, names)
    if name == "kv_direction" and value in KV_DIRECTIONS:
        return value
    if name in OUR_TEXT_ATTRS and value in OUR_TEXT_ATTRS[name]:
        return value
    if name == "pg_config":
        return _pg_config(value, names)
    return names(value)


def _values(text: str, names: Pseudonyms, bucket: bool) -> str:
    """Inputs' / outputs' values (JSON): strings but device names pseudonymised; with
    ``bucket``, every whole number above 1 rounded up to a power of two (sizes, strides and
    offsets given as arguments, such as ``aten::set_``'s or ``aten::view``'s), but a tensor's
    id, storage id and item size (the 1st, 2nd and 5th of [id, storage, offset, numel,
    itemsize, device])."""
    try:
        values = orjson.loads(text)
    except orjson.JSONDecodeError:
        return orjson.dumps(names(text)).decode()

    def walk(value):
        if isinstance(value, str):
            return value if DEVICES.match(value) else names(value)
        if bucket and isinstance(value, int) and not isinstance(value, bool):
            return _power_of_two(value)
        if isinstance(value, list):
            if bucket and _is_tensor(value):
                return [value[0], value[1], _power_of_two(value[2]), _power_of_two(value[3]),
                        value[4], walk(value[5])]
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {names(str(k)): walk(v) for k, v in value.items()}
        return value

    return orjson.dumps(walk(values)).decode()


def _is_tensor(value: list) -> bool:
    """A tensor's [id, storage, offset, numel, itemsize, device] among an ET's values."""
    return (len(value) == 6 and isinstance(value[5], str)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value[:5]))


def _types(text: str, names: Pseudonyms) -> str:
    """Types kept where every word is PyTorch's own; any other type is a pseudonym."""
    try:
        types = orjson.loads(text)
    except orjson.JSONDecodeError:
        return orjson.dumps(names(text)).decode()
    if not isinstance(types, list):
        return orjson.dumps(names(text)).decode()
    out = []
    for t in types:
        if isinstance(t, str) and all(w in TYPE_WORDS for w in _TYPE_TOKEN.findall(t)):
            out.append(t)
        else:
            out.append(names(str(t)))
    return orjson.dumps(out).decode()


def _power_of_two(n: int) -> int:
    return n if n <= 1 else 1 << (n - 1).bit_length()


def _shapes(text: str) -> str:
    try:
        shapes = orjson.loads(text)
    except orjson.JSONDecodeError:
        return "[]"

    def walk(value):
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return _power_of_two(value)
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return orjson.dumps(walk(shapes)).decode()


# ---------------------------------------------------------------------------------- nodes


def share_node(node, names: Pseudonyms, options: Options, removed: Removed,
               retimed: share_times.Retimed | None = None, at: tuple[int, int] = (0, 0)
               ) -> None:
    """Rewrite one decoded Node in place (``retimed``: the run's new times, this node's rank
    index and position ``at``)."""
    if node.name != GAP_NAME:
        node.name = names(node.name, "op")
    bucket = options.level in ("shapes", "times")
    for side, io in (("inputs", node.inputs), ("outputs", node.outputs)):
        if io.values:
            shared = _values(io.values, names, bucket)
            if shared != io.values:
                removed.io.add(f"{side}.values")
            io.values = shared
        if io.types:
            shared = _types(io.types, names)
            if shared != io.types:
                removed.io.add(f"{side}.types")
            io.types = shared
        if bucket and io.shapes:
            io.shapes = _shapes(io.shapes)
    for attr in node.attr:
        kind = attr.WhichOneof("value")
        if kind == "string_val":
            shared = string_attr(attr.name, attr.string_val, names)
            if shared != attr.string_val:
                removed.attrs.add(attr.name)
                attr.string_val = shared
        elif attr.name in THREAD_INT_ATTRS and kind in ("int64_val", "uint64_val", "int32_val"):
            setattr(attr, kind, names.number(getattr(attr, kind)))
            removed.attrs.add(attr.name)
    if retimed is not None:
        share_times.apply(node, retimed, *at, _DURATION_ATTRS)


def share_metadata(metadata, removed: Removed) -> None:
    """The metadata, in place, without file names, paths, pids and notes (noted in
    ``removed``)."""
    kept = []
    for attr in metadata.attr:
        kind = attr.WhichOneof("value")
        if kind == "string_val" and attr.name not in KEPT_META_STRINGS:
            removed.metadata.add(attr.name)
        elif attr.name in DROPPED_META_INTS:
            removed.metadata.add(attr.name)
        else:
            kept.append(attr)
    del metadata.attr[:]
    metadata.attr.extend(kept)


# ------------------------------------------------------------------------------------ run


@dataclass
class Shared:
    files: list[Path]
    left_out: list[Path]
    removed: Removed


def share_run(folder: Path, out: Path, key: bytes, options: Options) -> Shared:
    """Write the shared copy of the conversion in ``folder`` to ``out`` (a new folder)."""
    if options.level not in LEVELS:
        raise ValueError(f"--level {options.level!r}: one of {', '.join(LEVELS)}")
    if options.level == "times" and not 0 < options.bound < 1:
        raise ValueError("--level times needs --bound between 0 and 1 (e.g. 0.05: durations "
                         "within 5 % of the recorded ones)")
    ets = sorted(p for p in folder.iterdir() if p.is_file() and _is_et(p))
    if not ets:
        raise TraceFormatError(folder, "folder", "a conversion's output (chakra.<rank>.et files): "
                               "`chakra-hooks convert` writes one")
    names = Pseudonyms(key)
    removed = Removed()
    retimed = None
    if options.level == "times":  # the run's new times, before any ET is written
        ranks, groups, world = read_run(ets)
        peers = run_peers.analyse(ranks, groups, world)
        retimed = share_times.retime(ets, ranks, peers, key, options.seed, options.bound)
        del ranks, peers
    shared: list[Path] = []
    left_out = sorted(p for p in folder.iterdir() if p not in ets and p.name not in RUN_FILES)
    with storage.replaced_whole(out, "sharing") as staging:
        for i, path in enumerate(ets):  # one ET in memory at a time
            et = etio.read_et(path)
            mine = Removed()
            for p, node in enumerate(et.nodes):
                share_node(node, names, options, mine, retimed, (i, p))
            share_metadata(et.metadata, mine)
            et.metadata.attr.extend([
                make_attr("share_level", options.level),
                make_attr("share_removed", mine.describe(options.level)),
                make_attr("share_pseudonyms", "HMAC-SHA256 under the sharer's key, 48 bits")])
            if options.level == "times":
                et.metadata.attr.append(make_attr("share_duration_bound", float(options.bound)))
            etio.write_et(staging / path.name, et.metadata, et.nodes, compress=et.compressed)
            shared.append(out / path.name)
            removed.metadata |= mine.metadata
            removed.attrs |= mine.attrs
            removed.io |= mine.io
            del et
        for name in RUN_FILES:
            source = folder / name
            if not source.exists():
                continue
            if name == GROUPS_FILE:
                groups = {_pg_name(k, names): v for k, v in read_groups(folder).items()}
                etio.atomic_write(staging / name, [orjson.dumps(groups)])
            else:
                shutil.copyfile(source, staging / name)
            shared.append(out / name)
    return Shared(shared, left_out, removed)


# ---------------------------------------------------------------------------------- check

# The format's own words, which a shared run holds and an input may too.
_FORMAT_WORDS = frozenset({
    *KINETO_CATEGORIES, *TYPE_WORDS, "thread", "stream", "default", "device", "comm_group",
    "host_gap", "AllReduce", "AllGather", "ReduceScatter", "AllToAll", "SendRecv", "Broadcast",
    "Reduce", "Gather", "Scatter", "Barrier", "allreduce", "allgather", "reducescatter",
    "alltoall", "broadcast", "barrier", "all_reduce", "all_gather", "reduce_scatter",
    "all_to_all", "unknown", "replayed", "compute", "kineto", "baseTimeNanoseconds", "session",
    "timestamp_ns", "offset_ps", "device_offset_ps", "start_time_micros", "duration_micros",
    "rounded", "record_function_id", "external_id", "name_sequence", "pytorch", "chakra",
    "producer", "NO_MEMORY_EXPANSION", "topology", "npus_count", "bandwidth", "latency",
    "fitted", "measured", "collectives", "astra_system", "HMAC", "SHA256", "sharer",
    # the schema's field names, and the words of the shared metadata's share_* fields
    "inputs", "outputs", "values", "shapes", "types", "ctrl_deps", "data_deps", "metadata",
    "pseudonyms", "string", "strings", "attributes", "dropped", "tensor", "element", "counts",
    "rounded", "powers", "durations", "perturbed",
    # Kineto's process-group fields, the keys of pg_config
    "pg_name", "pg_desc", "pg_size", "backend_config",
    # the clocks' descriptions
    "offset", "profile", "xspace", "session", "epoch",
    # the converter's texts (replayed_as_compute) and ASTRA-sim's configuration words
    "single", "member", "process", "matching", "MEM_LOAD", "MEM_STORE", "METADATA",
    "COMPUTE", "COLLECTIVE", "NO_MEMORY_EXPANSION", "active", "chunks",
    "collective", "dataset", "dimension", "enabled", "endpoint", "gather", "implementation",
    "localBWAware", "memory", "optimization", "policy", "preferred", "reduce", "roofline",
    "scatter", "scheduling", "splits",
})
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{5,}")
_NUMBER = re.compile(rb"(?<![0-9])[0-9]{5,}(?![0-9])")
_PRINTABLE = re.compile(rb"[\x20-\x7e]{4,}")


@dataclass
class Leak:
    token: str
    where: str  # the input file and the string it came from
    found_in: str  # the shared file


def _shared_words(folder: Path) -> tuple[dict[bytes, str], set[str]]:
    """Words (and numbers) in the shared files' text -> a file holding them; and the names of
    the ETs' attributes and metadata fields (the schema's, never a user's)."""
    words: dict[bytes, str] = {}
    fields: set[str] = set()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        raw = etio.read_bytes(path)[0]
        runs = _PRINTABLE.findall(raw)
        if _is_et(path):
            runs += [text.encode("utf-8", "replace") for text in set(_et_strings(path))]
        for run in runs:
            for token in (*_WORD.findall(run), *_NUMBER.findall(run)):
                words.setdefault(token, path.name)
        if _is_et(path):
            et = etio.read_et(path)
            fields.update(a.name for a in et.metadata.attr)
            for a in et.metadata.attr:  # the field names the sharing says it removed
                if a.name == "share_removed":
                    fields.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", a.string_val))
            for node in et.nodes:
                fields.update(a.name for a in node.attr)
    return words, fields


_JSON_STRING = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_JSON_ID = re.compile(rb'"(?:pid|tid)"\s*:\s*(-?[0-9]+)')


def _is_et(path: Path) -> bool:
    return re.search(r"\.et(\.gz)?$", path.name) is not None


def _et_strings(path: Path) -> Iterable[str]:
    """Every string a Chakra ET holds, decoded (its printable runs would glue a field's name
    to the byte after it): node names, string attributes, the inputs' and outputs' texts and
    the strings inside them, the metadata's strings."""
    et = etio.read_et(path)

    def inside(text: str) -> Iterable[str]:
        yield text
        try:
            stack = [orjson.loads(text)]
        except orjson.JSONDecodeError:
            return
        while stack:
            value = stack.pop()
            if isinstance(value, str):
                yield value
            elif isinstance(value, list):
                stack.extend(value)
            elif isinstance(value, dict):
                stack.extend(value.keys())
                stack.extend(value.values())

    for attr in et.metadata.attr:
        if attr.WhichOneof("value") == "string_val":
            yield attr.string_val
    for node in et.nodes:
        yield node.name
        for attr in node.attr:
            if attr.WhichOneof("value") == "string_val":
                yield from inside(attr.string_val)
            elif attr.WhichOneof("value") == "string_list":
                yield from attr.string_list.values
        for io in (node.inputs, node.outputs):
            for text in (io.values, io.types, io.shapes):
                if text:
                    yield from inside(text)


def _input_strings(path: Path) -> Iterable[tuple[bytes, bool]]:
    """(string, is an id) of one input file, each distinct string once: every string of a
    JSON file (keys too, escapes undone) and its ``pid`` / ``tid`` numbers; the printable runs
    of any other file (protobuf holds its strings as bytes). Read with regular expressions
    over the raw bytes, not decoded: a trace of 100 MB is read in a few seconds."""
    if _is_et(path):
        for text in set(_et_strings(path)):
            yield text.encode("utf-8", "replace"), False
        return
    raw = etio.read_bytes(path)[0]
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".json") and raw.lstrip()[:1] in (b"{", b"["):
        seen = set(_JSON_STRING.findall(raw))
        for text in seen:
            if b"\\" in text:
                try:
                    text = orjson.loads(b'"' + text + b'"').encode("utf-8", "replace")
                except orjson.JSONDecodeError:
                    pass
            yield text, False
        for number in set(_JSON_ID.findall(raw)):
            yield number, True
        return
    for run in set(_PRINTABLE.findall(raw)):
        yield run, False


def _exact_numbers(value, out: list[int]) -> None:
    """The whole numbers above 1 that are not powers of two in a decoded JSON value (a
    tensor's id, storage id and item size left out)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if value > 1 and value & (value - 1):
            out.append(value)
    elif isinstance(value, list):
        if _is_tensor(value):
            value = [value[2], value[3]]
        for v in value:
            _exact_numbers(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _exact_numbers(v, out)


@dataclass
class ExactShape:
    file: str
    node: int
    where: str  # inputs.shapes, outputs.values, ...
    numbers: list[int]


def exact_shapes(shared: Path) -> tuple[str, list[ExactShape]]:
    """The shared run's level, and, at ``shapes`` and ``times``, every node whose inputs' or
    outputs' shapes or values hold a whole number the sharing would have rounded."""
    level, found = "", []
    for path in sorted(shared.glob("*.et*")):
        et = etio.read_et(path)
        level = next((a.string_val for a in et.metadata.attr if a.name == "share_level"), "")
        if level not in ("shapes", "times"):
            continue
        for node in et.nodes:
            for side, io in (("inputs", node.inputs), ("outputs", node.outputs)):
                for part in ("shapes", "values"):
                    text = getattr(io, part)
                    if not text:
                        continue
                    numbers: list[int] = []
                    try:
                        _exact_numbers(orjson.loads(text), numbers)
                    except orjson.JSONDecodeError:
                        continue
                    if numbers:
                        found.append(ExactShape(path.name, node.id, f"{side}.{part}", numbers))
    return level, found


def _conversion_of(shared: Path, inputs: list[Path]) -> list[tuple[Path, Path]] | None:
    """(original ET, shared ET) of every shared rank, where the inputs hold the conversion the
    shared run was made of (the folder convert wrote, or its ETs); None where they do not."""
    shared_ets = sorted(p for p in shared.iterdir() if _is_et(p))
    originals: dict[str, Path] = {}
    for path in inputs:
        for p in ([path] if path.is_file() else sorted(path.iterdir()) if path.is_dir() else []):
            if _is_et(p):
                originals[p.name] = p
    if not shared_ets or any(p.name not in originals for p in shared_ets):
        return None
    return [(originals[p.name], p) for p in shared_ets]


@dataclass
class Checked:
    """What ``check`` found: words and ids of the inputs in the shared files (``leaks``, of
    ``searched``), exact shapes (at ``shapes`` and ``times``), and, at ``times``, the
    recorded durations that can be read back (None: no conversion among the inputs to
    compare with)."""

    level: str
    leaks: list[Leak]
    searched: int
    shapes: list[ExactShape]
    durations: share_times.Recovered | None

    @property
    def found(self) -> bool:
        return bool(self.leaks or self.shapes or self.durations and self.durations.count)


def check(shared: Path, inputs: list[Path]) -> Checked:
    """Every word (6+ letters, digits or '_', starting with a letter) and every pid / tid (5+
    digits) of the original inputs, searched for in the text of every shared file; the
    format's own words and the ETs' field names are allowed. At ``shapes`` and ``times``,
    every shape and value is also looked at for a number left exact; at ``times``, the
    conversion among the inputs (if any) is compared with the shared run for durations that
    can be read back (``share_times.recoverable``)."""
    words, fields = _shared_words(shared)
    allowed = {w.encode() for w in _FORMAT_WORDS | fields}
    leaks: dict[bytes, Leak] = {}
    searched: set[bytes] = set()
    files = [p for path in inputs for p in ([path] if path.is_file() else sorted(
        q for q in path.rglob("*") if q.is_file()))]
    for path in files:
        for text, is_id in _input_strings(path):
            if is_id:
                number = text.lstrip(b"-")
                tokens = [number] if len(number) >= 5 else []
            else:
                tokens = _WORD.findall(text)
            for token in tokens:
                if token in allowed or classify(token.decode("utf-8", "replace")) is not None:
                    continue  # (a collective's name, in any of its spellings, is the format's)
                searched.add(token)
                if token in words and token not in leaks:
                    shown = text[:80].decode("utf-8", "replace")
                    leaks[token] = Leak(token.decode(), f"{path}: {shown!r}", words[token])
    level, shapes = exact_shapes(shared)
    durations = None
    pairs = _conversion_of(shared, inputs) if level == "times" else None
    if pairs:
        durations = share_times.recoverable([str(a) for a, _ in pairs],
                                            [str(b) for _, b in pairs])
    return Checked(level, list(leaks.values()), len(searched), shapes, durations)
