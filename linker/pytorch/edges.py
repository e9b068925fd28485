"""Synchronisation and data edges of a PyTorch linked trace, and the final edge pruning.

SYNC edges come from the runtime calls Kineto recorded (CUDA names and their HIP twins).
Old Kineto files do not say which stream or event a call used, so the rule reads the call
order on the calling thread, as the c10d / ATen code issues them:

- ``cudaDeviceSynchronize``: every stream's last device op launched before the call ->
  the first top-level host op on that thread that starts after the call returns.
- ``cudaStreamSynchronize``: same, for the stream of the last op the thread launched before
  the call (``.item()`` / ``.cpu()`` sync the stream their copy went to).
- ``cudaEventSynchronize``: same, for the stream of the last op the thread launched before
  its latest ``cudaEventRecord``.
- ``cudaStreamWaitEvent``: device -> device: the last op launched on the recording stream
  before the thread's latest ``cudaEventRecord`` -> the next op the thread launches (on the
  waiting stream); kept only when the two are on different streams (same-stream order is
  already a STREAM_ORDER edge).

When Kineto recorded ``cuda_sync`` activity (profiler option ``enable_cuda_sync_events``),
those records name the streams exactly (``stream``, ``wait_on_stream``, and the correlation of
the ``cudaEventRecord`` behind an event wait) and replace the rules above for their calls.

Every search is a bisect in per-thread or per-stream launch lists: linear-ish overall.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from operator import itemgetter
from typing import TYPE_CHECKING

from chakra_hooks.linker.model import CLOCK_TOLERANCE_PS, Edge, EdgeKind

if TYPE_CHECKING:
    from chakra_hooks.linker.model import Op
    from chakra_hooks.linker.pytorch.kineto_events import KEvent
    from chakra_hooks.linker.pytorch.link import PytorchLinker

_PREFIXES = ("cuda", "hip")
DEVICE_SYNC = {p + "DeviceSynchronize" for p in _PREFIXES} | {"cudaCtxSynchronize"}
STREAM_SYNC = {p + "StreamSynchronize" for p in _PREFIXES}
EVENT_SYNC = {p + "EventSynchronize" for p in _PREFIXES}
EVENT_RECORD = {p + s for p in _PREFIXES for s in ("EventRecord", "EventRecordWithFlags")}
WAIT_EVENT = {p + "StreamWaitEvent" for p in _PREFIXES}
# How soon after the op it waited for a device op starts, at most, for a wait that the trace
# did not record to be read from the clock (_waits_by_clock).
CLOCK_WAKE_MAX_PS = 20_000_000  # 20 us
_BACKWARD = re.compile(r"Backward\d*$")  # autograd node names: AddmmBackward0, ...
SYNC_NAMES = DEVICE_SYNC | STREAM_SYNC | EVENT_SYNC | EVENT_RECORD | WAIT_EVENT
# Enum members read per op or per edge, bound once: reading one off its class goes through
# EnumType's __getattr__ hook, about ten times the cost of a module global.
_SYNC, _DATA, _PARENT = EdgeKind.SYNC, EdgeKind.DATA, EdgeKind.PARENT
_C_PARENT = _PARENT  # (a C constant compiled: edges.pxd)
_FIRST = itemgetter(0)


class _Launches:
    """Launch-ordered device ops, per launching thread and per stream."""

    def __init__(self, launches: list) -> None:
        launches = sorted(launches, key=lambda x: x[0].start)
        self.thread: dict[tuple, tuple[list[int], list[int], list[str]]] = defaultdict(
            lambda: ([], [], []))
        self.lane: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        for runtime, uid, lane in launches:
            ts, uids, lanes = self.thread[(runtime.pid, runtime.tid)]
            ts.append(runtime.start)
            uids.append(uid)
            lanes.append(lane)
            lts, luids = self.lane[lane]
            lts.append(runtime.start)
            luids.append(uid)

    def last_lane_on_thread(self, key: tuple, t: int) -> str | None:
        entry = self.thread.get(key)
        if entry is None:
            return None
        i = bisect_left(entry[0], t) - 1
        return entry[2][i] if i >= 0 else None

    def next_on_thread(self, key: tuple, t: int) -> tuple[int, str] | None:
        entry = self.thread.get(key)
        if entry is None:
            return None
        i = bisect_right(entry[0], t)
        return (entry[1][i], entry[2][i]) if i < len(entry[0]) else None

    def next_on_lane(self, lane: str, t: int) -> int | None:
        entry = self.lane.get(lane)
        if entry is None:
            return None
        i = bisect_right(entry[0], t)
        return entry[1][i] if i < len(entry[0]) else None

    def last_on_lane(self, lane: str, t: int) -> int | None:
        entry = self.lane.get(lane)
        if entry is None:
            return None
        i = bisect_left(entry[0], t) - 1
        return entry[1][i] if i >= 0 else None


def add_sync_edges(linker: PytorchLinker) -> None:
    if linker.kt is None or not linker.launches:
        return
    launches = _Launches(linker.launches)
    waits = _HostWaits(launches, linker.host_waits, linker.edges)
    ends = _DeviceEnds(linker, launches)
    exact = {rec.args.correlation: rec for rec in linker.kt.syncs
             if type(rec.args.correlation) is int}
    last_record: dict[tuple, int] = {}
    window = linker.window
    calls = sorted((rt for rt in linker.kt.runtime if rt.name in SYNC_NAMES),
                   key=lambda rt: rt.start)
    if not any(rt.name in WAIT_EVENT for rt in calls):
        _waits_by_clock(linker, launches, ends)
    for rt in calls:
        key = (rt.pid, rt.tid)
        if rt.name in EVENT_RECORD:
            last_record[key] = rt.start
            continue
        if window is not None and not window[0] <= rt.start <= window[1]:
            continue
        corr = rt.args.correlation
        record = exact.get(corr) if type(corr) is int else None
        if record is not None:
            _exact_sync(record, rt, linker.runtime_by_corr, launches, waits)
        elif rt.name in WAIT_EVENT:
            _wait_event(launches, key, last_record.get(key), rt.start, linker, ends)
        elif rt.name in DEVICE_SYNC:
            waits.add(rt, list(launches.lane), rt.start)
        elif rt.name in STREAM_SYNC:
            waits.add(rt, [launches.last_lane_on_thread(key, rt.start)], rt.start)
        else:  # event synchronize: the stream the thread's latest record was on
            t = last_record.get(key)
            if t is not None:
                waits.add(rt, [launches.last_lane_on_thread(key, t)], t)


class _HostWaits:
    """Device -> host waits: each blocking call with the device ops it waited for, kept in
    ``linker.host_waits`` as (thread, call start ns, call end ns, device uids) for
    linker/pytorch/waits.py, which cuts the host op around the call (or, for a call between
    ops, makes the next op wait)."""

    def __init__(self, launches: _Launches, pending: list, edges: list[Edge]) -> None:
        self.launches, self.pending, self.edges = launches, pending, edges

    def add(self, rt: KEvent, lanes: list, t: int) -> None:
        """The last op launched before ``t`` on each lane, awaited by the call ``rt``."""
        awaited = []
        for lane in lanes:
            src = self.launches.last_on_lane(lane, t) if lane is not None else None
            if src is not None:
                awaited.append(src)
        if awaited:
            self.pending.append(((rt.pid, rt.tid), rt.start, rt.start + rt.dur, awaited))


def _exact_sync(record: KEvent, rt: KEvent, runtime_by_corr: dict, launches: _Launches,
                waits: _HostWaits) -> None:
    """A ``cuda_sync`` record names the streams (and the event's record call) exactly."""
    args = record.args
    device = args.device if args.device is not None else record.pid
    recorded = runtime_by_corr.get(args.wait_on_record)
    if record.name == "Stream Wait Event":
        if recorded is None:
            return
        src_lane = f"stream:{device}:{args.wait_on_stream}"
        src = launches.last_on_lane(src_lane, recorded.start)
        nxt = launches.next_on_lane(f"stream:{device}:{args.stream}", rt.start)
        if src is not None and nxt is not None and src != nxt:
            waits.edges.append(Edge(src, nxt, _SYNC))
    elif record.name == "Event Sync":
        if recorded is not None:
            waits.add(rt, [f"stream:{device}:{args.wait_on_stream}"], recorded.start)
    elif record.name == "Stream Sync":
        waits.add(rt, [f"stream:{device}:{args.stream}"], rt.start)
    else:  # Context Sync: every stream of the device
        prefix = f"stream:{device}:"
        waits.add(rt, [lane for lane in launches.lane if lane.startswith(prefix)], rt.start)


def _wait_event(launches: _Launches, key: tuple, record_t: int | None, t: int,
                linker: PytorchLinker, ends: _DeviceEnds) -> None:
    """A stream told to wait for an event: the next op the thread launches waits for the op
    before the event's record on the recording stream. Where the trace does not say which
    stream recorded it (no ``cudaEventRecord`` in old traces, or the guess ends after the
    waiting op began, so it cannot be what it waited for), the clock tells: the op of another
    stream of the device that ended last while the waiting op was held back (it had been
    launched and its stream was free), or nothing, counted in ``stream_waits_unresolved``."""
    nxt = launches.next_on_thread(key, t)
    if nxt is None:
        return
    dst_uid, dst_lane = nxt
    ops, stats = linker.ops, linker.trace.stats
    dst = ops[dst_uid]
    if dst.start_ps is None:
        return
    if record_t is not None:
        src_lane = launches.last_lane_on_thread(key, record_t)
        if src_lane is None or src_lane == dst_lane:
            return  # same-stream order is already a STREAM_ORDER edge
        src = launches.last_on_lane(src_lane, record_t)
        if src is not None and ops[src].start_ps is not None and \
                ops[src].start_ps + (ops[src].dur_ps or 0) - dst.start_ps <= CLOCK_TOLERANCE_PS:
            linker.edges.append(Edge(src, dst_uid, _SYNC))
            return
    held = ends.held_since(dst_uid, dst_lane, linker)
    if held is None:
        return  # it started as soon as it could: it did not wait for another stream
    src = ends.last_end(dst_lane, held, dst.start_ps + CLOCK_TOLERANCE_PS)
    if src is None:
        stats["stream_waits_unresolved"] = stats.get("stream_waits_unresolved", 0) + 1
        return
    stats["stream_waits_by_clock"] = stats.get("stream_waits_by_clock", 0) + 1
    linker.edges.append(Edge(src, dst_uid, _SYNC))


def _waits_by_clock(linker: PytorchLinker, launches: _Launches, ends: _DeviceEnds) -> None:
    """A trace that recorded no event waits at all (only launches: a sampled or filtered
    trace) still shows them: a device op held back after its launch returned and its stream was
    free, that began within ``CLOCK_WAKE_MAX_PS`` of the end of an op of another stream of its
    device, waited for that op (a stream's event wait is released within microseconds)."""
    found = 0
    for lane, (_, uids) in launches.lane.items():
        before = None
        for uid in uids:
            held = ends.held_since(uid, lane, linker, before)
            before = uid
            if held is None:
                continue
            start = linker.ops[uid].start_ps
            src = ends.last_end(lane, max(held, start - CLOCK_WAKE_MAX_PS),
                                start + CLOCK_TOLERANCE_PS)
            if src is not None:
                linker.edges.append(Edge(src, uid, _SYNC))
                found += 1
    linker.trace.stats["stream_waits_by_clock"] = found


def _launch_times(launches: list) -> tuple[dict[int, int], dict[int, int]]:
    """Per launched device op's uid, when its launch call ended (ps) and began (ns)."""
    ends, starts = {}, {}
    for rt, uid, _ in launches:
        ends[uid] = (rt.start + rt.dur) * 1000
        starts[uid] = rt.start
    return ends, starts


def _ends_by_device(ops: list[Op]) -> dict[str, tuple[list[int], list[tuple[int, int, str]]]]:
    """Per device, its stream ops' (end, uid, lane) in end order, and those ends alone."""
    per_device: dict[str, list[tuple[int, int, str]]] = {}
    lanes: dict[str, list[tuple[int, int, str]]] = {}  # a lane's device's list, found once
    for op in ops:
        lane = op.lane
        if op.on_device and lane.startswith("stream:") and op.start_ps is not None:
            entries = lanes.get(lane)
            if entries is None:
                entries = lanes[lane] = per_device.setdefault(_device_of(lane), [])
            entries.append((op.start_ps + (op.dur_ps or 0), op.uid, lane))
    ends = {}
    for device, entries in per_device.items():
        # By end; equal ends stay in uid order, as `ops` is (a uid is its op's place): the
        # order of sorting the tuples whole, without comparing tuples.
        entries.sort(key=_FIRST)
        ends[device] = ([e for e, _, _ in entries], entries)
    return ends


class _DeviceEnds:
    """Device ops by end time, per device, for waits the trace does not attribute."""

    def __init__(self, linker: PytorchLinker, launches: _Launches) -> None:
        self.launches = launches
        self.runtime_end, self.runtime_start = _launch_times(linker.launches)
        self.ends = _ends_by_device(linker.ops)

    def held_since(self, uid: int, lane: str, linker: PytorchLinker, before: int | None = None
                   ) -> int | None:
        """When ``uid`` could have started but for a wait (its launch returned and ``before``,
        the op before it on its stream, ended), if it started more than the tolerance later;
        else None."""
        op = linker.ops[uid]
        ready = self.runtime_end.get(uid)
        if ready is None or op.start_ps is None:
            return None
        if before is None:
            entry = self.launches.lane.get(lane)
            if entry is not None:
                i = bisect_left(entry[0], self.runtime_start[uid])
                while i < len(entry[1]) and entry[1][i] != uid:
                    i += 1
                before = entry[1][i - 1] if 0 < i < len(entry[1]) else None
        if before is not None:
            prev = linker.ops[before]
            if prev.start_ps is not None:
                ready = max(ready, prev.start_ps + (prev.dur_ps or 0))
        return ready if op.start_ps - ready > CLOCK_TOLERANCE_PS else None

    def last_end(self, lane: str, lo: int, hi: int) -> int | None:
        """The op of another stream of ``lane``'s device that ended last in [lo, hi]."""
        found = self.ends.get(_device_of(lane))
        if found is None:
            return None
        keys, entries = found
        i = bisect_right(keys, hi) - 1
        while i >= 0 and keys[i] >= lo:
            if entries[i][2] != lane:
                return entries[i][1]
            i -= 1
        return None


def _device_of(lane: str) -> str:
    return lane[:lane.rindex(":")]


def data_edges(linker: PytorchLinker) -> list[Edge]:
    """DATA edges between host ops on different threads (same-thread order is HOST_ORDER's),
    read from the ET's nodes as soon as the host ops exist (the linker then lets the nodes
    go, and adds these edges in their place among the others):

    - through ET tensor ids: the last op that output a tensor -> each later op taking it in;
    - through autograd: the op that ran a forward node -> the op that ran its backward node
      (they share the ET ``seq_id``). Backward ops take no tensors of their own in the ET
      (their nested kernels do), so without this the autograd thread would float free of
      the forward pass.
    """
    ops, edges = linker.ops, []
    tops = []  # (plain loops, not comprehensions: the compiled build types `op` and `node`)
    for op in ops:
        if "et_id" in op.attrs and op.inputs is not None:
            tops.append(op)
    tops.sort(key=_ET_ID)
    by_et = linker.et.by_id
    producer: dict[int, int] = {}
    get, data = producer.get, _DATA
    for op in tops:
        node = by_et[op.attrs["et_id"]]
        uid, lane = op.uid, op.lane
        seen = set()
        for tid in node.tensor_ids():
            src = get(tid)
            if src is not None and src not in seen and ops[src].lane != lane:
                seen.add(src)
                edges.append(Edge(src, uid, data))
        for tid in node.tensor_ids(outputs=True):
            producer[tid] = uid
    _autograd_edges(linker, tops, edges)
    return edges


def _ET_ID(op: object) -> int:  # noqa: N802 (a sort key, named like a constant)
    return op.attrs["et_id"]


def _autograd_edges(linker: PytorchLinker, tops: list, edges: list[Edge]) -> None:
    ops, by_et = linker.ops, linker.et.by_id
    forward: dict[int, int] = {}  # seq_id -> uid of the op that last ran that forward node
    backward: dict[str, bool] = {}  # node name -> is an autograd node (names are interned)
    data = _DATA
    for op in tops:
        uid, lane = op.uid, op.lane
        stack = [by_et[op.attrs["et_id"]]]
        while stack:  # the op's whole subtree, in program order
            node = stack.pop()
            children = node.children
            if children:
                stack.extend(reversed(children))
            seq = node.seq_id
            if type(seq) is not int or seq < 0:
                continue
            name = node.name
            is_backward = backward.get(name)
            if is_backward is None:
                is_backward = backward[name] = _BACKWARD.search(name) is not None
            if is_backward:
                src = forward.get(seq)
                if src is not None and ops[src].lane != lane:
                    edges.append(Edge(src, uid, data))
            else:
                forward[seq] = uid


def add_kineto_autograd_edges(linker: PytorchLinker) -> None:
    """Without an ET: forward -> backward DATA edges from Kineto's ``Sequence number``."""
    ops, edges = linker.ops, linker.edges
    forward: dict[int, int] = {}
    for ev in sorted((e for e in linker.kt.host if e.args.sequence_number is not None),
                     key=lambda e: e.start):
        top = ev
        while top is not None and top.op < 0:
            top = top.parent
        seq = ev.args.sequence_number
        if top is None or type(seq) is not int or seq < 0:
            continue
        if _BACKWARD.search(ev.name):
            src = forward.get(seq)
            if src is not None and ops[src].lane != ops[top.op].lane:
                edges.append(Edge(src, top.op, _DATA))
        else:
            forward[seq] = top.op


def prune_edges(linker: PytorchLinker) -> None:
    """Drop duplicates, self-edges, edges that would run backwards in time (those could close
    a cycle) and edges against the clock: a parent that ended more than CLOCK_TOLERANCE_PS
    after its child started cannot be what the child waited for (an asynchronous collective
    and the op after its call, an inferred sync from the wrong stream). Count what was dropped
    in the stats."""
    ops = linker.ops
    starts, ends = [], []
    for op in ops:
        start = op.start_ps
        starts.append(start)
        ends.append(None if start is None or op.dur_ps is None else start + op.dur_ps)
    width = len(ops) + 1  # src * width + dst: one int per pair, cheaper than a tuple
    kept, seen, backwards, late = [], set(), 0, 0
    parent = _C_PARENT  # (compiled: a C integer, as each edge's kind is read)
    tolerance = CLOCK_TOLERANCE_PS
    for e in linker.edges:
        src, dst = e.src, e.dst  # (compiled: C integers, and the pair one int object)
        pair = src * width + dst
        if src == dst or pair in seen:
            continue
        a, b = starts[src], starts[dst]
        if a is not None and b is not None:
            kind = e.kind
            if kind != parent:
                if a > b:
                    backwards += 1
                    continue
                end = ends[src]
                if end is not None and end - b > tolerance:
                    late += 1
                    continue
        else:
            # Untimed: fall back on ET ids (entry order); every edge we make follows it.
            ia, ib = ops[src].attrs.get("et_id"), ops[dst].attrs.get("et_id")
            if ia is not None and ib is not None and ia > ib:
                backwards += 1
                continue
        seen.add(pair)
        kept.append(e)
    linker.edges[:] = kept
    linker.trace.stats["edges_dropped_backwards"] = backwards
    linker.trace.stats["edges_dropped_against_clock"] = late
