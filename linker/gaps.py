"""Time between ops, made explicit: ``host_gap`` ops, so that replaying a linked trace with its
measured durations and dependencies takes as long as the recorded window did.

A thread is not busy every moment of a step: Python between ops, data loading and waits that
no profiled op covers take time too (on the corpus's ResNet rank, 356 of the main thread's
667 ms). An ET without that time replays too fast. Per host lane, and per device lane (the time
a stream sat idle after the host op launching its next op had ended, or waiting for launches
the trace does not hold), every stretch where the lane ran no op becomes one op
(:func:`add_gaps`; :func:`add_idle_gaps` for ASTRA-sim, see there):

- name ``host_gap``, kind COMPUTE, on the lane's side (host or device), measured start and
  duration, attribute ``gap_ns``; the first gap of a lane starts at the window's start (the
  earliest op of the trace), so a lane that begins late is not replayed early;
- edges: the op before it -> gap -> the op after it (HOST_ORDER). A gap is a lower bound on
  when the next op may start, beside the op's other dependencies, never added on top of them:
  time the lane spent waiting for another lane or the device (a sync edge) is not counted
  twice, since a replay takes the later of the two.

Gaps shorter than ``MIN_GAP_PS`` are left out: Chakra durations are whole microseconds and a
shorter gap would be written as 0 or 1. A consumer that wants ops only drops the nodes named
``host_gap`` and gives each successor its predecessor's dependencies.
"""

from __future__ import annotations

from chakra_hooks.linker.model import Edge, EdgeKind, LinkedTrace, Op, OpKind

GAP_NAME = "host_gap"
MIN_GAP_PS = 1_000_000  # 1 us
_COMM_KINDS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)


def add_gaps(trace: LinkedTrace) -> int:
    """Add the gap ops of ``trace`` (module docstring); returns how many."""
    timed = [op for op in trace.ops if op.start_ps is not None and op.dur_ps is not None]
    if not timed:
        return 0
    window_start = min(op.start_ps for op in timed)
    host_lanes = any(not op.on_device for op in timed)
    by_uid = {op.uid: op for op in timed}
    # device op -> (end, uid) of the host op that launched it (the latest-ending, if several)
    launched_by: dict[int, tuple[int, int]] = {}
    for e in trace.edges:
        src = by_uid.get(e.src)
        if e.kind == EdgeKind.LAUNCH and src is not None:
            launched_by[e.dst] = max(launched_by.get(e.dst, (0, -1)),
                                     (src.start_ps + src.dur_ps, src.uid))
    lanes: dict[str, list[Op]] = {}
    for op in timed:
        if not op.lane.startswith("comm:"):
            lanes.setdefault(op.lane, []).append(op)
    next_uid = max(op.uid for op in trace.ops) + 1
    added = 0
    for lane, ops in lanes.items():
        ops.sort(key=lambda o: (o.start_ps, o.uid))
        cursor, previous = window_start, None
        for op in ops:
            # A device op waits for the host op that launched it: only idle time after that
            # launch ended (a CUDA graph's later kernels, say) is the stream's own gap.
            begin, launch = cursor, None
            if op.on_device and host_lanes and op.uid in launched_by:
                end, launcher = launched_by[op.uid]
                if end > cursor:  # the gap runs from the launch's end: it follows the launch
                    begin, launch = end, launcher
            if op.start_ps - begin >= MIN_GAP_PS:
                _insert_gap(trace, next_uid, lane, op, begin, previous, launch)
                next_uid += 1
                added += 1
            end = op.start_ps + op.dur_ps
            if end >= cursor:
                cursor, previous = end, op
    trace.stats["gaps"] = added
    return added


def _insert_gap(trace: LinkedTrace, uid: int, lane: str, op: Op, start: int,
                previous: Op | None, launch: int | None = None) -> None:
    """A gap op from ``start`` to ``op``'s start on ``lane``: previous -> gap -> op (and the
    host op whose end ``start`` is, ``launch`` -> gap: without it a device lane's first gap
    would replay from time zero)."""
    dur = op.start_ps - start
    gap = Op(uid=uid, name=GAP_NAME, kind=OpKind.COMPUTE, on_device=op.on_device, lane=lane,
             start_ps=start, dur_ps=dur, attrs={"gap_ns": dur // 1000})
    trace.ops.append(gap)
    if previous is not None:
        trace.edges.append(Edge(previous.uid, gap.uid, EdgeKind.HOST_ORDER))
    if launch is not None:
        trace.edges.append(Edge(launch, gap.uid, EdgeKind.LAUNCH))
    trace.edges.append(Edge(gap.uid, op.uid, EdgeKind.HOST_ORDER))


def add_idle_gaps(trace: LinkedTrace) -> int:
    """Gaps for consumers that run one host op and one device op at a time (ASTRA-sim's
    analytical backend: one CPU, one GPU compute and one GPU comm resource per NPU).

    Per resource, only the stretches where none of its lanes ran anything: host lanes together
    (a thread's gap while another thread worked would be serialised with that work, counting
    the time twice), and the device's compute lanes together (likewise for two streams). Each
    stretch becomes one gap before the op that ended it, on that op's lane; a host gap and a
    device gap at the same time occupy different resources, so both are kept. Collectives
    (their own resource, timed by the simulator's network model) get none.

    Counting host and device apart matters: with one stretch for both (nothing at all
    running), the host's time between ops while the GPU worked was lost, and host-bound
    stretches later replayed short (rtx2080 0.91 of its span, DLRM 0.92, the sampled ranks
    0.75 / 0.80; now 1.01, 1.05, 1.03 / 1.04: benchmarks/bench_fidelity.py)."""
    timed = sorted((op for op in trace.ops if op.start_ps is not None and op.dur_ps is not None
                    and not op.lane.startswith("comm:") and op.kind not in _COMM_KINDS),
                   key=lambda o: (o.start_ps, o.uid))
    if not timed:
        return 0
    window_start = timed[0].start_ps
    next_uid = max(op.uid for op in trace.ops) + 1
    added = 0
    for on_device in (False, True):
        last_on_lane: dict[str, Op] = {}
        reach = window_start  # the end of everything of this resource that started so far
        for op in timed:
            if op.on_device != on_device:
                continue
            if op.start_ps - reach >= MIN_GAP_PS:
                _insert_gap(trace, next_uid, op.lane, op, reach, last_on_lane.get(op.lane))
                next_uid += 1
                added += 1
            reach = max(reach, op.start_ps + op.dur_ps)
            last_on_lane[op.lane] = op
    trace.stats["gaps"] = added
    return added
