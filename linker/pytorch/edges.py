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
from typing import TYPE_CHECKING

from chakra_hooks.linker.model import Edge, EdgeKind

if TYPE_CHECKING:
    from chakra_hooks.linker.pytorch.kineto_events import KEvent
    from chakra_hooks.linker.pytorch.link import _Linker

_PREFIXES = ("cuda", "hip")
DEVICE_SYNC = {p + "DeviceSynchronize" for p in _PREFIXES} | {"cudaCtxSynchronize"}
STREAM_SYNC = {p + "StreamSynchronize" for p in _PREFIXES}
EVENT_SYNC = {p + "EventSynchronize" for p in _PREFIXES}
EVENT_RECORD = {p + s for p in _PREFIXES for s in ("EventRecord", "EventRecordWithFlags")}
WAIT_EVENT = {p + "StreamWaitEvent" for p in _PREFIXES}
_BACKWARD = re.compile(r"Backward\d*$")  # autograd node names: AddmmBackward0, ...
SYNC_NAMES = DEVICE_SYNC | STREAM_SYNC | EVENT_SYNC | EVENT_RECORD | WAIT_EVENT
# Enum members read per op or per edge, bound once: reading one off its class goes through
# EnumType's __getattr__ hook, about ten times the cost of a module global.
_SYNC, _DATA, _PARENT = EdgeKind.SYNC, EdgeKind.DATA, EdgeKind.PARENT


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


def add_sync_edges(linker: _Linker) -> None:
    if linker.kt is None or not linker.launches:
        return
    launches = _Launches(linker.launches)
    host = {key: sorted(v) for key, v in linker.thread_ops.items()}
    waits = _HostWaits(host, launches, linker.edges)
    exact = {rec.args.correlation: rec for rec in linker.kt.syncs
             if rec.args.correlation is not None}
    last_record: dict[tuple, int] = {}
    edges, window = linker.edges, linker.window
    calls = sorted((rt for rt in linker.kt.runtime if rt.name in SYNC_NAMES),
                   key=lambda rt: rt.start)
    for rt in calls:
        key = (rt.pid, rt.tid)
        if rt.name in EVENT_RECORD:
            last_record[key] = rt.start
            continue
        if window is not None and not window[0] <= rt.start <= window[1]:
            continue
        record = exact.get(rt.args.correlation)
        if record is not None:
            _exact_sync(record, rt, linker.runtime_by_corr, launches, waits)
        elif rt.name in WAIT_EVENT:
            _wait_event(launches, key, last_record.get(key), rt.start, edges)
        elif rt.name in DEVICE_SYNC:
            waits.add(rt, list(launches.lane), rt.start)
        elif rt.name in STREAM_SYNC:
            waits.add(rt, [launches.last_lane_on_thread(key, rt.start)], rt.start)
        else:  # event synchronize: the stream the thread's latest record was on
            t = last_record.get(key)
            if t is not None:
                waits.add(rt, [launches.last_lane_on_thread(key, t)], t)


class _HostWaits:
    """Device -> host SYNC edges: the host op after a blocking call waits for device work."""

    def __init__(self, host: dict, launches: _Launches, edges: list[Edge]) -> None:
        self.host, self.launches, self.edges = host, launches, edges
        self.starts = {key: [s for s, _ in v] for key, v in host.items()}

    def add(self, rt: KEvent, lanes: list, t: int) -> None:
        """Edges from the last op launched before ``t`` on each lane to the first top-level
        host op of ``rt``'s thread that starts after ``rt`` returned."""
        key = (rt.pid, rt.tid)
        starts = self.starts.get(key)
        if not starts:
            return
        i = bisect_left(starts, rt.start + rt.dur)
        if i == len(starts):
            return
        dst = self.host[key][i][1]
        for lane in lanes:
            src = self.launches.last_on_lane(lane, t) if lane is not None else None
            if src is not None:
                self.edges.append(Edge(src, dst, _SYNC))


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
                edges: list[Edge]) -> None:
    if record_t is None:
        return
    src_lane = launches.last_lane_on_thread(key, record_t)
    nxt = launches.next_on_thread(key, t)
    if src_lane is None or nxt is None or nxt[1] == src_lane:
        return
    src = launches.last_on_lane(src_lane, record_t)
    if src is not None:
        edges.append(Edge(src, nxt[0], _SYNC))


def add_data_edges(linker: _Linker) -> None:
    """DATA edges between host ops on different threads (same-thread order is HOST_ORDER's):

    - through ET tensor ids: the last op that output a tensor -> each later op taking it in;
    - through autograd: the op that ran a forward node -> the op that ran its backward node
      (they share the ET ``seq_id``). Backward ops take no tensors of their own in the ET
      (their nested kernels do), so without this the autograd thread would float free of
      the forward pass.
    """
    ops, edges = linker.ops, linker.edges
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
    _autograd_edges(linker, tops)


def _ET_ID(op: object) -> int:  # noqa: N802 (a sort key, named like a constant)
    return op.attrs["et_id"]


def _autograd_edges(linker: _Linker, tops: list) -> None:
    ops, edges, by_et = linker.ops, linker.edges, linker.et.by_id
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


def add_kineto_autograd_edges(linker: _Linker) -> None:
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


def prune_edges(linker: _Linker) -> None:
    """Drop duplicates, self-edges and edges that would run backwards in time (those could
    close a cycle); count what was dropped in the stats."""
    ops = linker.ops
    starts = []
    for op in ops:
        starts.append(op.start_ps)
    width = len(ops) + 1  # src * width + dst: one int per pair, cheaper than a tuple
    kept, seen, backwards = [], set(), 0
    parent = _PARENT
    for e in linker.edges:
        src, dst = e.src, e.dst
        pair = src * width + dst
        if src == dst or pair in seen:
            continue
        a, b = starts[src], starts[dst]
        if a is not None and b is not None:
            if a > b and e.kind != parent:
                backwards += 1
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
