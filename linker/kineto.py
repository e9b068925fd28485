"""Kineto (Chrome-trace JSON) reader for the PyTorch linker.

Reads ``.json`` / ``.json.gz`` once: msgspec splits ``traceEvents`` into raw slices, then
decodes them CHUNK at a time into typed structs (``args`` keys we do not read are skipped, not
built; only device events, ``cuda_sync`` records and collective host ranges get all of
:class:`KArgs`, the rest the smaller :class:`CommonArgs`), and keeps only what linking needs:
host ranges (``cpu_op``, ``user_annotation``), runtime calls (``cuda_runtime``, ``cuda_driver``:
launches and synchronisation), device activity (``kernel``, ``gpu_memcpy``, ``gpu_memset``),
device-side ``cuda_sync`` records, and the ``ac2g`` flow ends (a fallback link from a device
op to its launch when ``correlation`` is missing). Everything else (python_function, flows
for fwd/bwd, counters, metadata) is dropped after decoding.

Time: ``ts`` / ``dur`` are microseconds with three decimals. Each is turned into integer
nanoseconds at once (``round(x * 1000)``; ints are scaled exactly) and, when the file has
``baseTimeNanoseconds``, shifted by it, so no float survives the reader. The clock is named
``kineto:baseTimeNanoseconds`` (relative timestamps made absolute) or ``kineto:epoch-us``
(older files whose ``ts`` already is absolute).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from sys import intern

import msgspec

from chakra_hooks.errors import TraceFormatError
from chakra_hooks.linker.jsonio import decode, read_bytes

HOST_CATS = frozenset(("cpu_op", "user_annotation"))
RUNTIME_CATS = frozenset(("cuda_runtime", "cuda_driver"))
DEVICE_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))


def _internal(name: str) -> object:
    """A struct field no JSON key can fill (filled by the reader or the linker)."""
    return msgspec.field(default=None, name="chakra_hooks.internal." + name)


class KArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys the linker reads; every other key is skipped by the decoder.

    ``get`` takes the key as Kineto spells it, so callers read ``args.get("External id")``.
    Values are typed ``object``: a file with an odd type for one key must not fail to load.
    """

    correlation: object = None
    external_id: object = msgspec.field(default=None, name="External id")
    record_function_id: object = msgspec.field(default=None, name="Record function id")
    stream: object = None
    device: object = None
    bytes: object = None
    bandwidth: object = msgspec.field(default=None, name="memory bandwidth (GB/s)")
    kind: object = None
    collective_name: object = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: object = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: object = msgspec.field(default=None, name="Out msg nelems")
    dtype: object = None
    pg_name: object = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: object = msgspec.field(default=None, name="Process Group Ranks")
    in_split: object = msgspec.field(default=None, name="In split size")
    out_split: object = msgspec.field(default=None, name="Out split size")
    input_dims: object = msgspec.field(default=None, name="Input Dims")
    input_type: object = msgspec.field(default=None, name="Input type")
    sequence_number: object = msgspec.field(default=None, name="Sequence number")
    # cuda_sync records (profiler option enable_cuda_sync_events): who waited on what.
    wait_on_stream: object = None
    wait_on_record: object = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")

    def get(self, key: str, default: object = None) -> object:
        value = getattr(self, _ARG_ATTR.get(key, "\x00"), None)
        return default if value is None else value


_ARG_ATTR = {f.encode_name: f.name for f in msgspec.structs.fields(KArgs)}
_NO_ARGS = KArgs()


class CommonArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` of a kept event that needs no more than the common keys (nearly every
    event): what is decoded for every event, in a third of KArgs' memory; the other KArgs
    attributes are class attributes, all None, so both read alike.

    Events that may need more get a full :class:`KArgs` (decoded again from their own JSON
    slice, see :func:`wants_full_args`): device events, ``cuda_sync`` records, and host
    ranges that carry collective metadata. A linker rule reading another key from another
    event must extend that rule.
    """

    correlation: object = None
    external_id: object = msgspec.field(default=None, name="External id")
    record_function_id: object = msgspec.field(default=None, name="Record function id")
    sequence_number: object = msgspec.field(default=None, name="Sequence number")
    stream: object = None
    device: object = None

    get = KArgs.get


_COMMON = frozenset(f.name for f in msgspec.structs.fields(CommonArgs))
for _name in (f.name for f in msgspec.structs.fields(KArgs) if f.name not in _COMMON):
    setattr(CommonArgs, _name, None)
# Host ranges whose args the comm rules read (pytorch_comms: record_param_comms metadata,
# c10d op input dims and types, nccl:* annotations).
_FULL_HOST_NAMES = frozenset(("record_param_comms",))
_FULL_HOST_PREFIXES = ("c10d::", "nccl:")


def wants_full_args(cat: str, name: str) -> bool:
    """Whether a kept event gets all of KArgs (else CommonArgs)."""
    if cat in DEVICE_CATS or cat == "cuda_sync":
        return True
    return cat in HOST_CATS and (name in _FULL_HOST_NAMES or name.startswith(_FULL_HOST_PREFIXES))


class _FullArgs(msgspec.Struct, gc=False):
    args: KArgs | list | str | int | float | bool | None = None


_FULL_ARGS_DECODER = msgspec.json.Decoder(list[_FullArgs])


class KEvent(msgspec.Struct, gc=False):
    """One Kineto event as decoded; kept ones get ``start`` / ``dur`` in integer ns.

    ``start`` / ``dur`` hold the file's ``ts`` / ``dur`` (float or int microseconds) while
    decoding and are replaced by integer nanoseconds by the reader: one slot each, so no
    float outlives the reader. ``parent`` (host ranges: the enclosing range on the same
    thread), ``op`` (uid of the linked-trace op this range became, -1 if none) and ``et``
    (the matched host ET node) are filled in by the linker.
    """

    name: str = ""
    cat: str = ""
    ph: str = ""
    pid: object = None
    tid: object = None
    start: object = msgspec.field(default=None, name="ts")
    dur: object = 0
    # Any JSON value decodes (a dropped event with odd args must not fail the file); kept
    # events must have an object (or nothing), checked by the reader. Decoded as CommonArgs;
    # see there for the events that get a KArgs.
    args: CommonArgs | list | str | int | float | bool | None = _NO_ARGS
    id: object = None
    parent: object = _internal("parent")
    op: int = msgspec.field(default=-1, name="chakra_hooks.internal.op")
    et: object = _internal("et")

    @property
    def end(self) -> int:
        return self.start + self.dur


class _KinetoDoc(msgspec.Struct):
    # Events stay raw slices of the file first, then are decoded CHUNK at a time (one
    # decoder call per chunk: a call per event cost more than the decoding itself), so
    # that dropped events and the floats and strings of kept ones never all exist at once.
    traceEvents: list[msgspec.Raw] | None = None
    baseTimeNanoseconds: object = None
    distributedInfo: object = None


CHUNK = 1024
_DECODER = msgspec.json.Decoder(_KinetoDoc)
_EVENTS_DECODER = msgspec.json.Decoder(list[KEvent])
_WHERE = re.compile(r"\$(\[\d+\])")


@dataclass(slots=True)
class KinetoTrace:
    """The kept content of one Kineto file."""

    path: Path
    clock: str
    base_ns: int  # 0 when timestamps are absolute
    raw_bytes: int
    distributed: dict = field(default_factory=dict)
    host: list[KEvent] = field(default_factory=list)  # cpu_op + user_annotation
    runtime: list[KEvent] = field(default_factory=list)  # cuda_runtime / cuda_driver
    device: list[KEvent] = field(default_factory=list)  # kernel / gpu_memcpy / gpu_memset
    syncs: list[KEvent] = field(default_factory=list)  # device-side cuda_sync records
    flow_ends: dict[tuple, int] = field(default_factory=dict)  # (pid, tid, ts ns) -> ac2g id
    pids: set = field(default_factory=set)  # host process ids seen on host ranges
    events_total: int = 0
    ids: dict = field(default_factory=dict)  # reading: pid / tid values -> one shared object
    _full_names: dict = field(default_factory=dict)  # reading: category -> wants_full_args cache

    def kept_by_cat(self) -> dict[str, tuple[list[KEvent], str, dict | None]]:
        """Category -> (the list its events are kept in, the one shared category string,
        a name -> wants_full_args cache, or None if no event of it needs its full args)."""
        out: dict[str, tuple[list[KEvent], str, dict | None]] = {}
        for cats, kept in ((HOST_CATS, self.host), (RUNTIME_CATS, self.runtime),
                           (DEVICE_CATS, self.device), (("cuda_sync",), self.syncs)):
            for cat in cats:
                out[cat] = (kept, cat, self._full_names.setdefault(cat, {}))
        for cat in RUNTIME_CATS:
            out[cat] = (self.runtime, cat, None)
        return out

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return rank if isinstance(rank, int) else None

    @property
    def world_size(self) -> int | None:
        size = self.distributed.get("world_size")
        return size if isinstance(size, int) else None


def _ns(value: object) -> int:
    """Microseconds (int, or float with 3 decimals) -> integer ns, exactly where possible."""
    if type(value) is int:
        return value * 1000
    return round(value * 1000)  # type: ignore[operator]


def read_kineto(path: Path) -> KinetoTrace:
    """Read a Kineto trace; raises TraceFormatError for anything that is not one."""
    path = Path(path)
    raw = read_bytes(path)
    doc = decode(path, raw, _DECODER, list[msgspec.Raw])
    if isinstance(doc, list):  # the Chrome trace "array" form
        doc = _KinetoDoc(doc)
    if doc.traceEvents is None:
        raise TraceFormatError(path, "top level", "a Kineto trace object with a 'traceEvents' list")
    base = doc.baseTimeNanoseconds
    base_ns = base if type(base) is int else 0
    clock = "kineto:baseTimeNanoseconds" if base_ns else "kineto:epoch-us"
    dist = doc.distributedInfo
    trace = KinetoTrace(path, clock, base_ns, len(raw), dist if isinstance(dist, dict) else {})
    del raw  # the raw slices keep the bytes alive until the events are decoded
    events, doc.traceEvents = doc.traceEvents, None
    uncorrelated = 0
    for lo in range(0, len(events), CHUNK):
        uncorrelated += _read_events(trace, _decode_chunk(trace.path, events, lo), events, lo)
    if uncorrelated:  # only then are the ac2g flow ends worth indexing
        _index_flow_ends(trace, events)
    trace.events_total = len(events)
    if not (trace.host or trace.device or trace.runtime):
        raise TraceFormatError(path, "traceEvents", "at least one cpu_op, runtime or device event "
                               "(the trace is empty)")
    return trace


def _decode_chunk(path: Path, events: list[msgspec.Raw], lo: int) -> list[KEvent]:
    """Events ``lo`` to ``lo + CHUNK``, decoded in one call (their slices joined)."""
    try:
        return _EVENTS_DECODER.decode(b"[%b]" % b",".join(events[lo:lo + CHUNK]))
    except msgspec.ValidationError as exc:
        # A typed field of one event is wrong: name the event.
        found = _WHERE.search(str(exc))
        where = f"traceEvents[{lo + int(found.group(1)[1:-1])}]" if found else "traceEvents"
        raise TraceFormatError(path, where, "an event with name, pid, tid, numeric ts / dur "
                               f"({exc})") from exc


def _read_events(trace: KinetoTrace, events: list[KEvent], raws: list[msgspec.Raw],
                 first: int) -> int:
    """Keep what linking needs from decoded events (``events[i]`` is event ``first + i`` of
    the file, whose JSON is ``raws[first + i]``), set integer times; the hot loop. Returns
    how many device events have no correlation.

    Memory matters here (a 1 GB trace has millions of events): the float ``ts`` / ``dur``
    are replaced once converted, and repeated names, categories and thread ids share one
    object.
    """
    pids = trace.pids
    base = trace.base_ns
    out_of = trace.kept_by_cat()
    host, device = trace.host, trace.device
    get = out_of.get
    ids = trace.ids
    uncorrelated = 0
    no_args, common_type = _NO_ARGS, CommonArgs
    needs_full: list[KEvent] = []  # events whose args are decoded again as KArgs, at the end
    full_raws: list[msgspec.Raw] = []
    for index, ev in enumerate(events, first):
        if ev.ph != "X":
            continue
        found = get(ev.cat)
        if found is None:
            continue
        out, cat, full_names = found
        ev.cat = cat  # one shared string per category, not one per event
        args = ev.args
        try:
            if type(args) is not common_type:
                if args is not None and args is not no_args:
                    raise TypeError(f"'args' is a {type(args).__name__}, not an object")
                ev.args = args = no_args
            ts, dur = ev.start, ev.dur
            ev.start = base + (ts * 1000 if type(ts) is int else round(ts * 1000))
            ev.dur = dur * 1000 if type(dur) is int else round(dur * 1000)
        except TypeError as exc:
            raise TraceFormatError(trace.path, f"traceEvents[{index}]",
                                   f"an event with name, pid, tid, numeric ts / dur ({exc})"
                                   ) from exc
        name = ev.name
        if ev.tid is None or not name:
            raise TraceFormatError(trace.path, f"traceEvents[{index}]",
                                   "an event with name, pid and tid")
        name = ev.name = intern(name)
        if full_names is not None:  # None: this category never needs its full args
            full = full_names.get(name)
            if full is None:
                full = full_names[name] = wants_full_args(cat, name)
            if full and args is not no_args:
                needs_full.append(ev)
                full_raws.append(raws[index])
        if out is host:
            pids.add(ev.pid)
        elif out is device and args.correlation is None:
            uncorrelated += 1
        ev.pid = ids.setdefault(ev.pid, ev.pid)
        ev.tid = ids.setdefault(ev.tid, ev.tid)
        out.append(ev)
    if full_raws:  # one decoder call for all of them (a call each cost more than decoding)
        for ev, full in zip(needs_full, _FULL_ARGS_DECODER.decode(b"[%b]" % b",".join(full_raws))):
            ev.args = full.args
    return uncorrelated


def _index_flow_ends(trace: KinetoTrace, raws: list[msgspec.Raw]) -> None:
    base, flow_ends = trace.base_ns, trace.flow_ends
    for lo in range(0, len(raws), CHUNK):
        for ev in _decode_chunk(trace.path, raws, lo):
            ts = ev.start
            if ev.ph == "f" and ev.cat == "ac2g" and isinstance(ts, (int, float)):
                flow_ends[(ev.pid, ev.tid, base + (ts * 1000 if type(ts) is int
                                                  else round(ts * 1000)))] = ev.id
