"""Slack: the time between ops that no dependency explains, made explicit as ``host_gap`` ops.

An ET is a model: a node starts when its dependencies have ended. Where a lane waited for
something the trace records (a launch, a stream sync, a collective, a copy), that wait is an
edge, and changing the awaited node's duration moves the waiter (a what-if). What remains is
slack: Python between ops, data loading, launch latency, waits the trace cannot attribute. For
each op, the slack is the time from the latest end of its dependencies (and of the op before
it on its lane) to its start; where it is ``MIN_GAP_PS`` or more it becomes one gap op:

- name ``host_gap``, kind COMPUTE, on the op's lane and side (host or device), attribute
  ``gap_ns``; its measured start is where the slack began;
- edges: every dependency of the op (and the lane's previous op) -> gap -> op. The op keeps
  its own dependencies too, so the graph still says what it waited for; a replay starts the gap
  when the last of them ends, which is exactly where the slack began in the recording.

So replaying with measured durations takes as long as the recorded window, and a gap never
holds time that a dependency explains: make a collective shorter and whatever waited for it
starts earlier by as much.

Lanes (:func:`add_gaps` default) suit consumers that run every thread and stream in parallel.
ASTRA-sim's analytical backend runs one host op and one device compute op at a time per NPU
(``per_resource=True``): there, host lanes together and device compute lanes together are
one resource each, the op before is the resource's latest-ending op, and collectives (their
own resource, timed by the network model) get none. A collective that ran on a host thread
(gloo) gets its gap on the thread that called it: the time before the call is the thread's.

Gaps shorter than ``MIN_GAP_PS`` are left out (Chakra durations are whole microseconds). A
consumer that wants ops only drops the nodes named ``host_gap``: every op still has its own
dependencies.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from chakra_hooks.linker.model import Edge, EdgeKind, LinkedTrace, Op, OpKind

GAP_NAME = "host_gap"
MIN_GAP_PS = 1_000_000  # 1 us
_COMM_KINDS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)
_PARENT, _HOST_ORDER = EdgeKind.PARENT, EdgeKind.HOST_ORDER


def add_gaps(trace: LinkedTrace, per_resource: bool = False,
             replay_dur: Callable[[Op], int] | None = None) -> int:
    """Add the gap ops of ``trace`` (module docstring); returns how many.

    ``replay_dur`` gives the duration a consumer will replay an op for, where it differs from
    the measured one (ASTRA-sim runs some nodes in zero time): a dependency's end is taken
    from it, so the slack a consumer sees is the slack it gets."""
    timed = [op for op in trace.ops if op.start_ps is not None and op.dur_ps is not None]
    if not timed:
        trace.stats["gaps"] = 0
        return 0
    dur = replay_dur or _measured
    ends = {op.uid: op.start_ps + dur(op) for op in timed}
    incoming: dict[int, list[Edge]] = defaultdict(list)
    for e in trace.edges:
        incoming[e.dst].append(e)
    window_start = min(op.start_ps for op in timed)
    groups: dict[str, list[tuple[Op, str, bool]]] = defaultdict(list)
    for op in timed:
        place = _placement(op, per_resource, dur)
        if place is not None:
            key, lane, occupies = place
            groups[key].append((op, lane, occupies))
    next_uid = max(op.uid for op in trace.ops) + 1
    added = gap_ps = 0
    for members in groups.values():
        members.sort(key=lambda m: (m[0].start_ps, m[0].uid))
        reach, before = window_start, None  # the lane's (resource's) latest end, and whose
        for op, lane, occupies in members:
            ready, waited_for = reach, set()
            for e in incoming.get(op.uid, ()):
                waited_for.add(e.src)
                end = ends.get(e.src) if e.kind != _PARENT else None
                if end is not None and end > ready:
                    ready = end
            slack = op.start_ps - ready
            if slack >= MIN_GAP_PS:
                gap = Op(uid=next_uid, name=GAP_NAME, kind=OpKind.COMPUTE,
                         on_device=op.on_device and occupies, lane=lane, start_ps=ready,
                         dur_ps=slack, attrs={"gap_ns": slack // 1000})
                next_uid += 1
                trace.ops.append(gap)
                for e in incoming.get(op.uid, ()):
                    trace.edges.append(Edge(e.src, gap.uid, _PARENT if e.kind == _PARENT
                                            else _HOST_ORDER))
                if before is not None and before.uid not in waited_for:
                    trace.edges.append(Edge(before.uid, gap.uid, _HOST_ORDER))
                trace.edges.append(Edge(gap.uid, op.uid, _HOST_ORDER))
                added += 1
                gap_ps += slack
            if occupies:
                end = op.start_ps + dur(op)
                if end >= reach:
                    reach, before = end, op
    trace.stats["gaps"] = added
    trace.stats["gap_ps"] = gap_ps
    return added


def _measured(op: Op) -> int:
    return op.dur_ps


def _placement(op: Op, per_resource: bool, dur: Callable[[Op], int]
               ) -> tuple[str, str, bool] | None:
    """(group, gap lane, whether the op occupies its group) for ``op``, or None: no gap."""
    if op.lane.startswith("comm:"):
        # A host-side collective: the time before its call is its calling thread's.
        caller = op.attrs.get("calling_lane")
        if not isinstance(caller, str):
            return None
        return ("host" if per_resource else caller), caller, False
    if not per_resource:
        return op.lane, op.lane, True
    if op.on_device and (op.kind in _COMM_KINDS or (op.dur_ps and not dur(op))):
        return None  # the network's resource, or replayed in no time at all
    return ("device" if op.on_device else "host"), op.lane, True
