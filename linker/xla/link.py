"""XSpace + HLO -> one LinkedTrace per device (TPU chip, GPU, or CPU-backend device).

Device events are matched to HLO instructions by module and instruction name. The HLO comes,
in order of preference, from the XSpace's own ``/host:metadata`` plane (``Hlo Proto`` stat per
module run), from HLO text sidecars the collector saved, or from the instruction text in TPU
event names. From the HLO the linker takes data dependencies (operands, followed through
instructions that never run on their own: parameters, tuples, bitcasts, ...), message sizes
(operand shapes), replica groups and collective-permute pairs, and host-offload copies.
"""

from __future__ import annotations

import bisect
import heapq
import zlib
from array import array
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

try:  # read by Cython when it compiles this module (setup.py): see DeviceOpAttrs
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.xla import hlo
from chakra_hooks.linker.model import (
    CommInfo, CommType, EdgeColumns, EdgeKind, LinkedTrace, Op, OpKind, TensorIO,
)
from chakra_hooks.linker.sources import RankJob, TraceStream
from chakra_hooks.linker.gc_pause import gc_paused
from chakra_hooks.linker.xla.devices import (
    _NO_CORRELATION, Device, DeviceEvent, DeviceEvents, collect_devices, pack_column, unpack_column,
)
from chakra_hooks.linker.xla.xspace import PlaneView, find_plane, profile_start_ns, read_xspace

if not cython.compiled:  # the compiled build cimports its own (linker/xla/devices.pxd)
    from chakra_hooks.linker.xla.devices import _push

COMM_TYPES: dict[str, CommType] = {
    "all-reduce": CommType.ALL_REDUCE,
    "all-gather": CommType.ALL_GATHER,
    "reduce-scatter": CommType.REDUCE_SCATTER,
    "all-to-all": CommType.ALL_TO_ALL,
    "ragged-all-to-all": CommType.ALL_TO_ALL,
    "collective-broadcast": CommType.BROADCAST,
}

_MISSING = object()


# A device's ops and launches are most of what a conversion holds (docs/performance.md).
@cython.no_gc  # it holds names, numbers and a list at most: no reference cycle
@cython.cclass
class DeviceOpAttrs:
    """The ``Op.attrs`` of a device op or a host launch: its attributes with the names an XLA
    op has as fields (C fields compiled: 64 bytes, where a dict sharing its keys with the
    others took 120), other names in an ordinary dict. Every reader reads it as the dict it
    stands for: ``items()``, ``get``, ``in``, ``[]``, ``pop``, ``len``, and the order is the
    one those names are set in (``_new_op``, then ``_describe``), other names last.

    A named attribute whose value is None is absent (no op has one: a dict would hold it)."""

    def __init__(self, hlo_module: str | None = None, hlo_category: str | None = None,
                 correlation: int | None = None) -> None:
        self.hlo_module = hlo_module
        self.hlo_category = hlo_category
        self.correlation = correlation
        self.hlo_op = None
        self.hlo_opcode = None
        self.others = None  # dict of any other name

    def items(self) -> list[tuple[str, object]]:
        out = []
        if self.hlo_module is not None:
            out.append(("hlo_module", self.hlo_module))
        if self.hlo_category is not None:
            out.append(("hlo_category", self.hlo_category))
        if self.correlation is not None:
            out.append(("correlation", self.correlation))
        if self.hlo_op is not None:
            out.append(("hlo_op", self.hlo_op))
        if self.hlo_opcode is not None:
            out.append(("hlo_opcode", self.hlo_opcode))
        if self.others:
            out.extend(self.others.items())
        return out

    def get(self, name: str, default: object = None) -> object:
        field = _FIELDS.get(name, -1)  # (one lookup: comparing the name with each costs more)
        if field == 0:
            value = self.hlo_module
        elif field == 1:
            value = self.hlo_category
        elif field == 2:
            value = self.correlation
        elif field == 3:
            value = self.hlo_op
        elif field == 4:
            value = self.hlo_opcode
        else:
            return default if self.others is None else self.others.get(name, default)
        return default if value is None else value

    def __setitem__(self, name: str, value: object) -> None:
        field = _FIELDS.get(name, -1)
        if field == 0:
            self.hlo_module = value
        elif field == 1:
            self.hlo_category = value
        elif field == 2:
            self.correlation = value
        elif field == 3:
            self.hlo_op = value
        elif field == 4:
            self.hlo_opcode = value
        else:
            if self.others is None:
                self.others = {}
            self.others[name] = value

    def pop(self, name: str, default: object = _MISSING) -> object:
        value = self.get(name, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(name)
            return default
        if name in _FIELDS:
            self[name] = None
        else:
            del self.others[name]
        return value

    def __getitem__(self, name: str) -> object:
        value = self.get(name, _MISSING)
        if value is _MISSING:
            raise KeyError(name)
        return value

    def __delitem__(self, name: str) -> None:
        self.pop(name)

    def __contains__(self, name: object) -> bool:
        return self.get(name, _MISSING) is not _MISSING

    def __len__(self) -> int:
        count = ((self.hlo_module is not None) + (self.hlo_category is not None)
                 + (self.correlation is not None) + (self.hlo_op is not None)
                 + (self.hlo_opcode is not None))
        return count if self.others is None else count + len(self.others)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list[str]:
        return [name for name, _ in self.items()]

    def values(self) -> list[object]:
        return [value for _, value in self.items()]

    def update(self, other: object = (), **more: object) -> None:
        for name, value in dict(other, **more).items():
            self[name] = value

    def setdefault(self, name: str, default: object = None) -> object:
        value = self.get(name, _MISSING)
        if value is _MISSING:
            self[name] = value = default
        return value

    def copy(self) -> dict[str, object]:
        return dict(self.items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DeviceOpAttrs):
            other = dict(other.items())
        return isinstance(other, dict) and dict(self.items()) == other  # in any order, as dicts

    def __repr__(self) -> str:
        return repr(dict(self.items()))


_FIELDS = {"hlo_module": 0, "hlo_category": 1, "correlation": 2, "hlo_op": 3, "hlo_opcode": 4}
MutableMapping.register(DeviceOpAttrs)

_SHARED_DURATIONS = 1 << 16  # distinct durations whose integer a device's ops share (_shared)


def load(job: RankJob) -> list[LinkedTrace]:
    """One LinkedTrace per device found in ``job.files["xspace"]``, all in memory."""
    with gc_paused():  # events, ops and edges by the million, none in a reference cycle
        return list(load_each(job))


def load_each(job: RankJob) -> TraceStream:
    """The traces of :func:`load`, linked one device at a time as they are taken, so that
    only one device's ops are ever in memory (they take many times the device's share of the
    profile). What a trace needs from the other devices (replica group ids, which host
    launches are its own) is worked out from the events up front. Bad input raises here,
    before the first trace."""
    path = job.files["xspace"]
    space = read_xspace(path)
    modules = _modules(space, job, path)
    devices = collect_devices(space, packed=True)  # each unpacked for its turn
    if not devices:
        raise TraceFormatError(path, "planes", "a /device:TPU:<n> or /device:GPU:<n> plane, or "
                               "/host:CPU events with hlo_op stats (XLA CPU backend)")
    # A device that recorded nothing (one GPU of eight did the work) gets no ET: an empty file
    # would pass for a rank that ran.
    idle = [d.plane for d in devices if not d.events]
    devices = [d for d in devices if d.events]
    if not devices:
        raise TraceFormatError(path, "device planes", f"events on at least one device (all "
                               f"{len(idle)} recorded none)")
    ids = _device_ids(job, devices, path)
    group_ids = _group_ids(devices, modules, path, ids)
    launches = _host_launches(space, devices)
    metadata = {}
    start_ns = profile_start_ns(space)
    if start_ns is not None:
        metadata["profile_start_time_ns"] = start_ns
    metadata["source_file"] = str(path)
    warnings = _odd_stats_said(space.odd_stats, path, metadata)
    for key in ("hlo_source", "manifest"):
        if key in job.options:
            metadata[f"collector_{key}"] = str(job.options[key])

    def linked() -> Iterator[LinkedTrace]:
        with gc_paused():
            for k, dev in enumerate(devices):
                dev.events.unpack()
                trace = _DeviceLinker(dev, modules, path, ids[dev.ordinal]).link()  # takes dev.events
                _number_groups(trace, group_ids)
                if launches is not None:
                    launches.per_device[k].unpack()
                    _add_host_launches(trace, launches.per_device[k], launches)
                    launches.per_device[k] = None
                if k == 0:
                    trace.warnings.extend(warnings)
                if idle and k == 0:
                    trace.warnings.append(f"{path}: {len(idle)} devices recorded no events, no ET "
                                          f"written for them ({', '.join(idle[:8])})")
                trace.metadata.update(metadata)
                yield trace

    return TraceStream(len(devices), linked())


def _odd_stats_said(odd: dict[tuple[str, bool], int], path: Path, metadata: dict) -> list[str]:
    """Warnings (and metadata counts) for integer stats the profile recorded as strings."""
    said = []
    for readable, count_key, what in (
            (True, "xspace_stats_as_strings", "read as the integers they spell"),
            (False, "xspace_stats_unreadable", "not integers: left out, as if not recorded")):
        names = {name: n for (name, ok), n in odd.items() if ok is readable}
        if names:
            total = sum(names.values())
            metadata[count_key] = total
            listed = ", ".join(f"{name} x{n}" for name, n in sorted(names.items()))
            said.append(f"{path}: {total} distinct stat records that hold integers are strings "
                        f"({listed}): {what}")
    return said


# ---------------------------------------------------------------------------------------------
# What one device's trace needs from the others


def _group_ids(devices: list[Device], modules: dict[str, hlo.HloModule], path: Path,
               ids: dict[int, int]) -> dict[tuple[int, ...], int]:
    """Every distinct replica group a device's collectives run in -> its id, the same in every
    trace of the file (ids 1.. in sorted order of the member lists). Each distinct event
    (module, name, instruction text, copy stream) is resolved once, as the linker resolves it."""
    groups: set[tuple[int, ...]] = set()
    for dev in devices:
        probe = _DeviceLinker(dev, modules, path, ids[dev.ordinal])
        events = dev.events
        events.unpack()
        # TPU instruction texts build modules as they are met: meet them in linking order
        order = events.linking_order() if events.detail is not None else range(len(events))
        for i in _first_of_each_kind(order, events.module_key, events.name, events.detail,
                                     events.copy):
            group = probe.group_of(events.event(i))
            if group is not None:
                groups.add(group)
        events.pack()
    return {g: i for i, g in enumerate(sorted(groups), start=1)}


def _first_of_each_kind(order: Iterable[int], module_key: array, name: array,
                        detail: array | None, copy: array) -> list[int]:
    """The events of ``order`` (indices into the columns) that are the first of their kind:
    (module, name, instruction details, copy stream), which decide what an event resolves to."""
    firsts: list[int] = []
    seen: set[object] = set()
    for i in order:
        m, n, d, c = module_key[i], name[i], 0 if detail is None else detail[i], copy[i]
        if cython.compiled and 0 <= m < 1 << 20 and 0 <= n < 1 << 20 and 0 <= d < 1 << 20 and 0 <= c < 4:
            # a C integer packed, where it fits; the name lowest, as it varies most (a set
            # probes by the low bits of an int's hash, which are the int's own)
            key: object = c << 60 | m << 40 | d << 20 | n
        else:
            key = (m, n, d, c)
        if key in seen:
            continue
        seen.add(key)
        firsts.append(i)
    return firsts


def _number_groups(trace: LinkedTrace, group_ids: dict[tuple[int, ...], int]) -> None:
    trace.groups = {i: list(g) for g, i in group_ids.items()}
    for op in trace.ops:
        members = op.attrs.pop("_group", None)
        if members is not None and op.comm is not None:
            op.comm.group = group_ids[tuple(members)]


_LAUNCH_COLUMNS = ("line", "offset", "dur", "metadata", "corr")


class _Launches:
    """The host calls that launched one device's work, as columns (there is a launch per
    kernel, and a tuple each would take six times the memory): the line it ran on (an index into
    ``lines``: lane and the line's start in ps), its offset on the line, its duration, its
    event metadata id and the correlation id. Integer columns become lists if a value needs
    more than 64 bits."""

    __slots__ = ("line", "offset", "dur", "metadata", "corr", "_packed")

    def __init__(self) -> None:
        self.line = array("i")
        self.offset, self.dur, self.metadata, self.corr = (array("q") for _ in range(4))
        self._packed: dict[str, tuple] | None = None

    def __len__(self) -> int:
        return len(self.corr)

    def pack(self) -> None:
        """Keep the columns compressed while the device waits for its turn, as its events
        are (DeviceEvents.pack): offsets on a line and correlation ids as the steps between
        them. Until :meth:`unpack`, nothing may be read. Columns widened to lists stay."""
        columns = [(name, getattr(self, name)) for name in _LAUNCH_COLUMNS]
        if any(type(column) is not array for _, column in columns):
            return
        self._packed = {name: pack_column(column, name in ("offset", "corr"))
                        for name, column in columns}
        for name, _ in columns:
            setattr(self, name, None)

    def unpack(self) -> None:
        """The columns back from :meth:`pack` (nothing to do if they are here)."""
        if self._packed is not None:
            for name, packed in self._packed.items():
                setattr(self, name, unpack_column(packed))
            self._packed = None

    def add(self, line: int, offset: int, dur: int, metadata: int, corr: int) -> None:
        n = len(self.line)  # the complete launches before this one
        try:
            self.offset.append(offset)
            self.dur.append(dur)
            self.metadata.append(metadata)
            self.corr.append(corr)
        except OverflowError:  # as lists (which take any int), cut back to n, then again
            self.offset, self.dur, self.metadata, self.corr = (
                list(column[:n]) for column in (self.offset, self.dur, self.metadata, self.corr))
            self.add(line, offset, dur, metadata, corr)
            return
        self.line.append(line)


@dataclass(slots=True)
class _HostLaunches:
    """Per device, the host calls that launched its work (:func:`_host_launches`)."""

    per_device: list[_Launches | None]
    lines: list[tuple[str, int]]  # (lane, the line's start in ps)
    names: dict[int, str]  # event metadata id -> name


def _host_launches(space, devices: list[Device]) -> _HostLaunches | None:
    """Per device, the host calls that launched its work (GPU), in the host plane's order:
    ``/host:CPU`` events with a ``correlation_id`` (hipModuleLaunchKernel, cuLaunchKernel,
    memcpy calls, on XLA's launch threads) that one of its events carries. An id that several
    devices carry is the last one's. Other host events (Python, the executor's ranges) serve
    all devices of the process at once and are left out: no one device's ET can own them.
    None: the profile has no such host events to look for."""
    host = find_plane(space, "/host:CPU")
    if host is None or "correlation_id" not in host.stat_ids:
        return None
    owner: dict[int, int] = {}  # correlation id -> index of the last device carrying it
    for k, dev in enumerate(devices):
        column = dev.events.column("correlation")
        if type(column) is list:
            owner.update((c, k) for c in column if c is not None)
        else:
            owner.update((c, k) for c in column if c != _NO_CORRELATION)
    if not owner:
        return None
    ids = {host.stat_ids["correlation_id"]: "correlation_id"}
    found = _HostLaunches([_Launches() for _ in devices], [], {})
    names = found.names
    for line in host.lines():
        number = len(found.lines)
        base = host.line_base_ps(line)
        found.lines.append((f"thread:{line.name}", base))
        for mid, start, dur, stats in host.events(line):
            corr = host.pick(stats, ids).get("correlation_id")
            k = owner.get(corr) if isinstance(corr, int) else None
            if k is not None:
                found.per_device[k].add(number, start - base, dur, mid, corr)
                if mid not in names:
                    names[mid] = host.event_name(mid)
    for launches in found.per_device:  # there is one per kernel: as many as device events
        launches.pack()
    return found


def _add_host_launches(trace: LinkedTrace, launches: _Launches, found: _HostLaunches) -> None:
    """A device's host launches (:func:`_host_launches`) become host ops on lane
    ``thread:<line>``, with a LAUNCH edge to the device op of their correlation id (the last
    one made, when an event made several) and program order (HOST_ORDER) along their thread."""
    # correlation id -> the device op; a launch shares its integer object, as launches of one
    # duration share theirs (_shared): a launch profile has a launch per kernel.
    device_op: dict[int, Op] = {}
    for op in trace.ops:
        corr = op.attrs.get("correlation")
        if corr is not None and op.on_device:
            device_op[corr] = op
    durations: dict[int, int] = {}
    lines, names = found.lines, found.names
    added = []
    for i in range(len(launches)):
        launched = device_op.get(launches.corr[i])
        if launched is None:  # its device event was dropped (out of range): said there
            continue
        lane, base = lines[launches.line[i]]
        op = Op(uid=len(trace.ops), name=names[launches.metadata[i]], kind=OpKind.COMPUTE,
                on_device=False, lane=lane, start_ps=base + launches.offset[i],
                dur_ps=_shared(launches.dur[i], durations),
                attrs=DeviceOpAttrs(None, None, launched.attrs["correlation"]))
        trace.ops.append(op)
        trace.edges.add(op.uid, launched.uid, EdgeKind.LAUNCH)
        added.append(op)
    added.sort(key=lambda o: (o.lane, o.start_ps, o.uid))
    for a, b in zip(added, added[1:]):
        if a.lane == b.lane:
            trace.edges.add(a.uid, b.uid, EdgeKind.HOST_ORDER)
    trace.stats["host_launches"] = len(added)


# ---------------------------------------------------------------------------------------------
# HLO modules


def _modules(space, job: RankJob, path: Path) -> dict[str, hlo.HloModule]:
    """Module key ("jit_f(123)") and plain name -> module, from the XSpace and sidecars."""
    modules: dict[str, hlo.HloModule] = {}
    meta = find_plane(space, "/host:metadata")
    if meta is not None:
        _modules_from_metadata(meta, modules, path)
    for role, file in sorted(job.files.items()):
        if not role.startswith("hlo:"):
            continue
        try:
            module = hlo.parse_hlo_text(Path(file).read_text(), source="hlo text")
        except (OSError, UnicodeDecodeError, hlo.HloParseError) as err:
            raise TraceFormatError(file, "HLO text", f"an XLA HLO module ({err})") from None
        modules.setdefault(role[4:], module)
        modules.setdefault(module.name, module)
    return modules


def _modules_from_metadata(meta: PlaneView, modules: dict[str, hlo.HloModule], path: Path) -> None:
    proto_id = meta.stat_ids.get("Hlo Proto")
    if proto_id is None:
        return
    for md in meta.plane.event_metadata.values():
        for st in md.stats:
            if st.metadata_id != proto_id:
                continue
            try:
                module = hlo.parse_hlo_proto(st.bytes_value)
            except Exception as err:  # noqa: BLE001 - any decode failure is a format error
                raise TraceFormatError(path, f"/host:metadata module {md.name!r}",
                                       f"a serialized xla.HloProto ({err})") from None
            modules[md.name] = module
            modules.setdefault(module.name, module)


def _device_ids(job: RankJob, devices: list[Device], path: Path) -> dict[int, int]:
    """Local device ordinal -> global rank.

    A profile names devices by their ordinal in the process. With several processes (multi-host
    JAX) the collector's manifest gives each local ordinal its global device id
    (``local_device_ids``) and lists every device of the run (``device_ids``); a device's
    rank is its place among those (JAX on CPU numbers a second process's devices from 2048:
    ranks must be 0..N-1). Without a manifest, ordinals are the ranks, which is right for a
    single process."""
    local = job.options.get("local_device_ids")
    ordinals = sorted({d.ordinal for d in devices})
    if isinstance(local, list) and local and all(isinstance(i, int) for i in local):
        if set(ordinals) <= set(local):
            ids = {o: o for o in ordinals}  # XLA's CPU backend names devices by global id
        elif max(ordinals) < len(local):
            ids = {o: local[o] for o in ordinals}
        else:
            raise TraceFormatError(path, f"device ordinal {max(ordinals)}",
                                   f"a device listed in the run manifest ({len(local)} local devices)")
        every = job.options.get("device_ids") or []  # without it, the ids are the ranks
        place = {device_id: rank for rank, device_id in enumerate(every)}
        return {o: place.get(ids[o], ids[o]) for o in ordinals}
    return {o: o for o in ordinals}


# ---------------------------------------------------------------------------------------------
# Per device


# A producer may end this much after its consumer started and still count as ended before
# it: Chakra times are whole microseconds.
_EDGE_SLACK_PS = 1_000_000

_UNSEEN = object()  # a key not looked up yet (None is a looked-up key's "no module")


@dataclass(slots=True)
class _DeviceLinker:
    dev: Device
    modules: dict[str, hlo.HloModule]
    path: Path
    device_id: int  # the device's global id: its rank, and its id in replica groups
    trace: LinkedTrace = field(init=False)
    # What the edges need of each event, as columns by its place in linking order (an object
    # per event was 80 bytes, beside its op's 517): its index in the device's columns, the uid
    # of its first op (the op's own integer, not a copy; an event's ops are made one after
    # the other, so the next event's first ends them), its module and instruction.
    order: array = field(default_factory=lambda: array("q"))
    firsts: list[int] = field(default_factory=list)
    module_of: list[hlo.HloModule | None] = field(default_factory=list)
    inst_of: list[hlo.Instruction | None] = field(default_factory=list)
    text_modules: dict[str, hlo.HloModule] = field(default_factory=dict)
    # module key -> its module (None: none known), looked up once per key, not per event
    module_by_key: dict[str, hlo.HloModule | None] = field(default_factory=dict)
    runs: dict[str, list[object]] = field(default_factory=dict)  # module -> exec keys in order
    has_transfers: bool = False  # the device has Async XLA Ops transfer spans (set in link())
    # (id(module), id(instruction)) -> (module, instruction, outputs, inputs or None) as
    # TensorIO: every run of an instruction has the same shapes, turned into JSON once
    io_of: dict[tuple[int, int], tuple] = field(default_factory=dict)

    def __post_init__(self) -> None:
        dev = self.dev
        # A device's edges are millions: as columns (model.EdgeColumns), 17 bytes an edge.
        self.trace = LinkedTrace(rank=self.device_id, framework="jax", clock=dev.clock,
                                 edges=EdgeColumns())
        self.trace.metadata.update({"device": dev.plane, "device_kind": dev.kind, "clock": dev.clock,
                                    "local_device_ordinal": dev.ordinal})

    def link(self) -> LinkedTrace:
        """The device's trace. Takes the device's events: they are gone once it returns."""
        events = self.dev.events
        ops = self.trace.ops
        self.has_transfers = events.has_transfers  # once, not per copy-start
        matched = 0
        order = events.linking_order()
        far = events.out_of_range()
        if far:
            order = [i for i in order if i not in far]
            self.trace.metadata["xspace_out_of_range"] = len(far)
            names = []  # a loop, not a generator: Cython cannot del what a closure holds
            for i in sorted(far)[:3]:
                names.append(repr(events.strings[events.name[i]][:40]))
            shown = ", ".join(names)
            self.trace.warnings.append(
                f"{self.path}: {self.dev.plane}: {len(far)} device events dropped whose time "
                f"cannot belong to the profile (starting over a day from the rest, or lasting "
                f"over a day: {shown}), with the host calls that launched them")
        repeats = events.exact_repeats(order)
        if repeats:  # a profile that recorded an event twice: one op, not two
            order = [i for i in order if i not in repeats]
            self.trace.metadata["xspace_repeats_dropped"] = len(repeats)
            self.trace.warnings.append(
                f"{self.path}: {self.dev.plane}: {len(repeats)} device events are exact repeats "
                "of another (same lane, name, start, duration and ids): dropped")
        self.order = order = array("q", order)  # uids follow this order
        firsts, module_of, inst_of = self.firsts, self.module_of, self.inst_of
        durations: dict[int, int] = {}  # kernels repeat their durations: see _shared
        for i in order:
            ev = events.event(i)
            ev.dur_ps = _shared(ev.dur_ps, durations)
            module, inst = self._resolve(ev)
            matched += inst is not None
            made = len(ops)
            self._make_ops(ev, module, inst)
            firsts.append(ops[made].uid)
            module_of.append(module)
            inst_of.append(inst)
        self._data_edges()
        # What only the data edges read goes before the stream-order edges, a device's peak:
        # the device's columns (about 45 bytes an event; its ops hold what the rest reads, so
        # linking takes them), the linking order and each event's module and instruction.
        sources = sorted({module.source for module in module_of if module is not None})
        count = len(order)  # without the events dropped above
        self.dev.events, self.order, self.module_of, self.inst_of = DeviceEvents(), array("q"), [], []
        del events, order, module_of, inst_of
        self._stream_edges()
        self._copy_edges()
        stats = self.trace.stats
        stats["device_events"] = count
        stats["hlo_matched"] = matched
        stats["hlo_match_rate"] = matched / count if count else 1.0
        stats["match_rate"] = stats["hlo_match_rate"]  # the key convert's summary table shows
        self.trace.metadata["hlo_source"] = ",".join(sources) or "none"
        return self.trace

    def _resolve(self, ev: DeviceEvent) -> tuple[hlo.HloModule | None, hlo.Instruction | None]:
        key = ev.module_key
        module = self.module_by_key.get(key, _UNSEEN)
        if module is _UNSEEN:
            module = self.module_by_key[key] = (self.modules.get(key)
                                                or self.modules.get(key.split("(")[0]))
        inst = module.instruction(ev.name) if module is not None else None
        if inst is None and ev.text is not None:  # TPU: the event name is the instruction
            module = self.text_modules.get(key)
            if module is None:
                module = self.text_modules[key] = hlo.HloModule(key, source="event text")
            inst = module.instruction(ev.name)
            if inst is None:
                try:
                    inst = hlo.parse_instruction(ev.text)
                except hlo.HloParseError as err:
                    self.trace.warnings.append(f"{self.dev.plane}: op {ev.name!r}: {err}")
                    return None, None
                module.add(hlo.Computation(f"{ev.name}.event", [inst]))
        return (module, inst) if inst is not None else (None, None)

    # -- ops ------------------------------------------------------------------------------

    def _make_ops(self, ev: DeviceEvent, module: hlo.HloModule | None, inst: hlo.Instruction | None) -> None:
        """Appends the ops of ``ev`` to the trace's ops (one, or a permute's several)."""
        ops = self.trace.ops
        if ev.copy in ("load", "store"):  # a GPU host<->device copy, whatever HLO asked for it
            op = _new_op(ops, ev, OpKind.MEM_LOAD if ev.copy == "load" else OpKind.MEM_STORE)
            if module is not None and inst is not None:
                self._describe(op, module, inst)
            return
        if inst is None or module is None:
            _new_op(ops, ev, OpKind.COMPUTE)
            return
        if ev.transfer or (inst.opcode == "copy-start" and not self.has_transfers):
            direction = hlo.host_offload_direction(module, inst)
            if direction is not None:
                op = _new_op(ops, ev, OpKind.MEM_LOAD if direction == "load" else OpKind.MEM_STORE,
                             f"{inst.name}:{'host_to_device' if direction == 'load' else 'device_to_host'}")
                self._describe(op, module, inst)
                op.bytes = module.operand_bytes(inst)
                return
        coll = hlo.collective_of(module, inst)
        if coll is None:
            op = _new_op(ops, ev, OpKind.COMPUTE)
            self._describe(op, module, inst)
            return
        if coll.kind == "collective-permute":
            self._permute_ops(ev, module, inst, coll)
            return
        op = _new_op(ops, ev, OpKind.COLLECTIVE)
        op.comm = CommInfo(size_bytes=coll.size_bytes, comm_type=COMM_TYPES[coll.kind])
        group = _group_of(coll.replica_groups, self.device_id)
        if group is not None:
            op.attrs["_group"] = list(group)  # replaced by the group's id (_number_groups)
        self._describe(op, module, inst)

    def group_of(self, ev: DeviceEvent) -> tuple[int, ...] | None:
        """The replica group of the collective op that ``ev`` becomes (:meth:`_make_ops`);
        None when it becomes none, or one of all devices. (A host-offload copy, which
        _make_ops tells apart first, is a copy-start: never a collective.)"""
        if ev.copy in ("load", "store"):
            return None
        module, inst = self._resolve(ev)
        coll = hlo.collective_of(module, inst) if inst is not None and module is not None else None
        if coll is None or coll.kind == "collective-permute":
            return None
        return _group_of(coll.replica_groups, self.device_id)

    def _permute_ops(self, ev: DeviceEvent, module: hlo.HloModule, inst: hlo.Instruction,
                     coll: hlo.Collective) -> None:
        """One SEND per target and one RECV per source this device has in the pairs."""
        me, ops = self.device_id, self.trace.ops
        tag = self._tag(ev, inst)
        made = 0
        for src, dst in coll.source_target_pairs:
            if me not in (src, dst) or src == dst:
                continue
            kind = OpKind.SEND if src == me else OpKind.RECV
            op = _new_op(ops, ev, kind, f"{inst.name}:{'send' if kind == OpKind.SEND else 'recv'}")
            op.comm = CommInfo(size_bytes=coll.size_bytes, src=src, dst=dst, tag=tag)
            self._describe(op, module, inst)
            made += 1
        if not made:  # this device only takes part as a bystander
            op = _new_op(ops, ev, OpKind.COMPUTE)
            self._describe(op, module, inst)

    def _tag(self, ev: DeviceEvent, inst: hlo.Instruction) -> int:
        """Same on sender and receiver: the k-th run of the module and the instruction."""
        runs = self.runs.setdefault(ev.module_key, [])
        if ev.exec_key not in runs:
            runs.append(ev.exec_key)
        run = runs.index(ev.exec_key)
        return (run * 65536 + (zlib.crc32(f"{ev.module_key}/{inst.name}".encode()) & 0xFFFF)) % (2**31)

    def _describe(self, op: Op, module: hlo.HloModule, inst: hlo.Instruction) -> None:
        op.attrs["hlo_op"] = inst.name
        op.attrs["hlo_opcode"] = inst.opcode
        # Every run of an instruction shares its two TensorIO objects (nothing changes one once
        # made): 112 bytes an op less than a pair each.
        cached = self.io_of.get((id(module), id(inst)))  # the entry keeps both alive: ids stay unique
        if cached is None:
            inputs = None
            if inst.operands:
                shapes, types = _io_json([module.operand_shape(inst, i)
                                          for i in range(len(inst.operands))])
                inputs = TensorIO(values="", shapes=shapes, types=types)
            shapes, types = _io_json([inst.shape])
            cached = self.io_of[(id(module), id(inst))] = (
                module, inst, TensorIO(values="", shapes=shapes, types=types), inputs)
        _, _, op.outputs, op.inputs = cached

    # -- edges ----------------------------------------------------------------------------

    def _data_edges(self) -> None:
        """Producer -> consumer through HLO operands, within one run of one module."""
        events = self.dev.events
        strings, module_keys, exec_keys = events.strings, events.module_key, events.exec_key
        start_ps, transfer = events.start_ps, events.is_transfer
        index: dict[tuple[object, str, str], tuple[list[int], list[int]]] = {}
        executed: dict[str, set[str]] = {}
        order, module_of = self.order, self.module_of
        for at, inst in enumerate(self.inst_of):
            if inst is None:
                continue
            i = order[at]
            name = inst.name + ("#transfer" if transfer(i) else "")
            module_key = strings[module_keys[i]]
            starts, uids = index.setdefault((module_key, str(exec_keys[i]), name), ([], []))
            starts.append(start_ps[i])
            uids.append(self._result_uid(at))
            executed.setdefault(module_key, set()).add(inst.name)
        memo: dict[tuple[str, str], tuple[str, ...]] = {}
        edges = self.trace.edges
        seen: set[tuple[int, int]] = set()
        overlapping = 0
        for at, inst in enumerate(self.inst_of):
            module = module_of[at]
            if inst is None or module is None:
                continue
            i = order[at]
            run = (strings[module_keys[i]], str(exec_keys[i]))
            if transfer(i):  # copy-start issues the transfer
                producers: tuple[str, ...] = (inst.name,)
            else:
                producers = _producers(module, inst, executed.get(run[0], set()), memo)
                start_name = hlo.async_start_of(inst)
                if start_name is not None and (run + (start_name + "#transfer",)) in index:
                    producers = producers + (start_name + "#transfer",)
            mine = None  # this event's uids, once a producer is found
            for prod in producers:
                found = index.get(run + (prod,))
                if found is None:
                    continue
                starts, uids = found
                k = bisect.bisect_right(starts, start_ps[i]) - 1
                if k < 0:
                    continue
                src = uids[k]
                if mine is None:
                    mine = _event_uids(self.trace.ops, self.firsts, at)
                for dst in mine:
                    # uids follow start order, so src < dst keeps the graph acyclic
                    if src < mine[0] and (src, dst) not in seen:
                        seen.add((src, dst))
                        if self._ended_before(src, dst):
                            edges.add(src, dst, EdgeKind.DATA)
                        else:
                            overlapping += 1
        self.trace.stats["data_edges_overlapping"] = overlapping

    def _ended_before(self, src: int, dst: int) -> bool:
        """Whether ``src`` had ended when ``dst`` started (to the microsecond). A consumer that
        started while its producer still ran did not wait for all of it (an async copy's
        transfer span drawn past the copy-done that reads it, on TPU): as a dependency, which
        means "after the producer ends", the edge would replay the consumer later than it ran
        (the TPU profile's critical path was 143 % of its span). Such edges are left out and
        counted (``data_edges_overlapping``)."""
        ops = self.trace.ops
        a, b = ops[src], ops[dst]
        return a.start_ps + a.dur_ps <= b.start_ps + _EDGE_SLACK_PS

    def _copy_edges(self) -> None:
        """A host-to-device copy on its own stream -> the first op that started after it ended
        on each compute stream of the device (SYNC): the compute stream waited for the data
        (XLA makes it wait on the copy's event), which the profile shows only as that order."""
        ops = self.trace.ops
        loads = [op for op in ops if op.kind == OpKind.MEM_LOAD]
        if not loads:
            return
        by_lane: dict[str, list[Op]] = {}
        for op in ops:
            if op.kind in (OpKind.COMPUTE, OpKind.COLLECTIVE):
                by_lane.setdefault(op.lane, []).append(op)
        for lane_ops in by_lane.values():
            lane_ops.sort(key=lambda o: o.start_ps)
            starts = [o.start_ps for o in lane_ops]
            for load in loads:
                if load.lane == lane_ops[0].lane:
                    continue
                k = bisect.bisect_left(starts, load.start_ps + load.dur_ps)
                if k < len(lane_ops):
                    self.trace.edges.add(load.uid, lane_ops[k].uid, EdgeKind.SYNC)

    def _result_uid(self, at: int) -> int:
        """The op whose output consumers read: the RECV of a permute, else the last op."""
        ops = self.trace.ops
        uids = _event_uids(ops, self.firsts, at)
        return next((u for u in uids if ops[u].kind == OpKind.RECV), uids[-1])

    def _stream_edges(self) -> None:
        """Each op waits for the latest op on its lane that had finished when it started.

        Ops of one event (a SEND and a RECV of one permute) are concurrent and all follow it.
        What an event's lane and times are is read from its first op (its ops share them)."""
        firsts, ops = self.firsts, self.trace.ops
        edges, stream_order = self.trace.edges, EdgeKind.STREAM_ORDER
        for on_lane in _events_by_lane(ops, firsts).values():
            _lane_edges(edges, ops, firsts, on_lane, stream_order)


def _events_by_lane(ops: list[Op], firsts: list[int]) -> dict[str, array]:
    """Lane -> its events' places in linking order (``firsts``: each event's first uid; an
    event's ops share its lane)."""
    by_lane: dict[str, array] = {}
    for at in range(len(firsts)):
        op = ops[firsts[at]]
        lane = op.lane
        on_lane = by_lane.get(lane)
        if on_lane is None:
            on_lane = by_lane[lane] = array("q")
        _push(on_lane, at)
    return by_lane


def _lane_edges(edges: EdgeColumns, ops: list[Op], firsts: list[int], on_lane: Sequence[int],
                kind: EdgeKind) -> None:
    """One lane's stream-order edges: each of its events (``on_lane``: their places in
    linking order, in start order) waits for the latest of them that had finished when it
    started."""
    # The usual stream runs one op at a time: then what had finished last when an op started
    # is the op before it (ends follow starts), which the heap walk finds at a cost.
    if _one_at_a_time(ops, firsts, on_lane):
        for k in range(1, len(on_lane)):
            _order_edges(edges, ops, firsts, on_lane[k - 1], on_lane[k], kind)
        return
    running: list[tuple[int, int, int]] = []  # heap of (end, k, k): the lane's k-th event
    last = -1  # none yet
    for k in range(len(on_lane)):
        at = on_lane[k]
        uid = firsts[at]
        first = ops[uid]
        start = first.start_ps
        while running and running[0][0] <= start:
            end, _, j = heapq.heappop(running)
            if last < 0:
                last = j
            else:
                uid = firsts[on_lane[last]]
                op = ops[uid]
                if (op.start_ps + op.dur_ps, last) <= (end, j):
                    last = j
        heapq.heappush(running, (start + first.dur_ps, k, k))
        if last >= 0:
            _order_edges(edges, ops, firsts, on_lane[last], at, kind)


def _new_op(ops: list[Op], ev: DeviceEvent, kind: OpKind, name: str | None = None) -> Op:
    """The op of device event ``ev`` (one of them, for a permute), appended to ``ops``."""
    attrs = DeviceOpAttrs(ev.module_key or None, ev.category or None, ev.correlation)
    op = Op(len(ops), name or ev.name, kind, True, ev.lane, ev.start_ps, ev.dur_ps, None,
            ev.bytes_accessed, ev.flops, None, None, attrs)
    ops.append(op)
    return op


def _shared(value: int, table: dict[int, int]) -> int:
    """``value`` as the one integer object ``table`` holds for it (kept while the table has
    fewer than _SHARED_DURATIONS): ops of one duration share it, 28 bytes an op, and a profile
    whose durations all differ does not grow the table without bound."""
    shared = table.get(value)
    if shared is not None:
        return shared
    if len(table) < _SHARED_DURATIONS:
        table[value] = value
    return value


def _event_end(ops: list[Op], firsts: list[int], at: int) -> int:
    """The uid after the last op of the event at ``at`` in linking order (``firsts``: each
    event's first uid; an event's ops are made one after the other)."""
    return firsts[at + 1] if at + 1 < len(firsts) else len(ops)


def _event_uids(ops: list[Op], firsts: list[int], at: int) -> list[int]:
    """The uids of the ops of the event at ``at`` in linking order (the ops' own integers)."""
    first, end = firsts[at], _event_end(ops, firsts, at)
    return [first] if end - first == 1 else [ops[u].uid for u in range(first, end)]


def _order_edges(edges: EdgeColumns, ops: list[Op], firsts: list[int], before: int, after: int,
                 kind: EdgeKind) -> None:
    """Every op of the event at ``after`` (in linking order) waits for every op of the one at
    ``before``."""
    src, dst = firsts[before], firsts[after]
    src_ops = _event_end(ops, firsts, before) - src
    dst_ops = _event_end(ops, firsts, after) - dst
    if src_ops == 1 and dst_ops == 1:  # the usual event: one op
        edges.add(src, dst, kind)
        return
    dsts = _event_uids(ops, firsts, after)
    for s in _event_uids(ops, firsts, before):
        for d in dsts:
            edges.add(s, d, kind)


def _one_at_a_time(ops: list[Op], firsts: list[int], on_lane: Sequence[int]) -> bool:
    """Whether each of a lane's events (its places in linking order, in start order) ended
    before the next one started."""
    for k in range(1, len(on_lane)):
        uid = firsts[on_lane[k - 1]]
        before = ops[uid]
        uid = firsts[on_lane[k]]
        after = ops[uid]
        if before.start_ps + before.dur_ps > after.start_ps:
            return False
    return True


def _producers(module: hlo.HloModule, inst: hlo.Instruction, executed: set[str],
               memo: dict[tuple[str, str], tuple[str, ...]]) -> tuple[str, ...]:
    """Executed instructions whose results ``inst`` reads, looking through the ones that never
    run as an op of their own (parameter, tuple, get-tuple-element, bitcast, constant ...)."""
    out: list[str] = []
    for name in inst.operands:
        if name in executed:
            out.append(name)
            continue
        key = (module.name, name)
        if key not in memo:
            memo[key] = ()  # guards against cycles through loop-carried values
            producer = module.instruction(name)
            memo[key] = _producers(module, producer, executed, memo) if producer is not None else ()
        out.extend(memo[key])
    return tuple(dict.fromkeys(out))


def _group_of(groups: list[list[int]] | None, device: int) -> tuple[int, ...] | None:
    if not groups:
        return None  # no groups: all devices
    for group in groups:
        if device in group:
            return tuple(group)
    return None


def _io_json(shapes: list[hlo.Shape | None]) -> tuple[str, str]:
    """(shapes, types) JSON text of a TensorIO; tuple shapes are flattened."""
    flat: list[hlo.Shape | None] = []
    for s in shapes:
        flat.extend(s.elements if s is not None and s.is_tuple else [s])
    return (orjson.dumps([list(s.dims) if s is not None else [] for s in flat]).decode(),
            orjson.dumps([s.dtype if s is not None else "" for s in flat]).decode())
