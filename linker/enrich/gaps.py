"""Slack: the time between ops that no dependency explains, made explicit as ``host_gap`` ops.

An ET is a model: a node starts when its dependencies have ended. Where a lane waited for
something the trace records (a launch, a stream sync, a collective, a copy), that wait is an
edge, and changing the awaited node's duration moves the waiter (a what-if). What remains is
slack: Python between ops, data loading, launch latency, waits the trace cannot attribute. For
each op, the slack is the time from the latest end of its dependencies (and of the op before
it on its lane) to its start; where it is ``MIN_GAP_PS`` or more it becomes one gap op:

- name ``host_gap``, kind COMPUTE, on the op's lane and side (host or device), attribute
  ``gap_ns``; its measured start is where the slack began;
- edges: the dependency that ended last (where the slack began) and the lane's previous op ->
  gap -> op. The op keeps its own dependencies too, so the graph still says what it waited for;
  a replay starts the gap when that dependency ends and the op when the gap and all its other
  dependencies have ended, which is exactly when it started in the recording.

So replaying with measured durations takes as long as the recorded window, and a gap never
holds time that a dependency explains: make a collective shorter and whatever waited for it
starts earlier by as much.

Lanes (:func:`add_gaps` default) suit consumers that run every thread and stream in parallel.
ASTRA-sim's analytical backend runs one host op and one device compute op at a time per NPU
(``per_resource=True``): there, host lanes together and device compute lanes together are
one resource each, the op before is the resource's latest-ending op, and collectives (their
own resource, timed by the network model) get a gap only where their lane also computes (a
TPU's XLA Ops line), not on a stream of their own. A collective that ran on a host thread
(gloo) gets its gap on the thread that called it: the time before the call is the thread's.

Gaps shorter than ``MIN_GAP_PS`` are left out (Chakra durations are whole microseconds). A
consumer that wants ops only drops the nodes named ``host_gap``: every op still has its own
dependencies.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

from chakra_hooks.linker.model import (Edge, EdgeColumns, EdgeKind, LinkedTrace, Op, OpKind,
                                       shared_key_attrs)

GAP_NAME = "host_gap"
MIN_GAP_PS = 1_000_000  # 1 us
# On device lanes, the slack left after a kernel's launch is mostly launch latency (a few us
# per kernel: 3,600 gaps on the ResNet rank, which doubled its node count): shorter slack
# there is left out, as it matters only where a host thread waits for that very kernel.
MIN_DEVICE_GAP_PS = 5_000_000  # 5 us
_COMM_KINDS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)
_PARENT, _HOST_ORDER = EdgeKind.PARENT, EdgeKind.HOST_ORDER
_COMPUTE = OpKind.COMPUTE


def add_gaps(trace: LinkedTrace, per_resource: bool = False,
             replay_dur: Callable[[Op], int] | None = None) -> int:
    """Add the gap ops of ``trace`` (module docstring); returns how many.

    ``replay_dur`` gives the duration a consumer will replay an op for, where it differs from
    the measured one (ASTRA-sim runs some nodes in zero time): a dependency's end is taken
    from it, so the slack a consumer sees is the slack it gets."""
    ops = trace.ops
    n = len(ops)
    # What is worked out per op is held in lists by the op's place in ``trace.ops``, not in
    # dicts keyed by uid: this runs on a whole device's ops at once, which on a large XLA
    # profile is its conversion's peak memory (docs/performance.md). For the same reason an
    # op's end is worked out where it is read, not kept: an integer an op.
    dur = replay_dur or _measured
    next_uid = 0
    window_start = None
    in_place = True  # every op's uid is its place (both linkers number their ops so)
    # (plain loops: the compiled build types `op`, and has no closures)
    for i, op in enumerate(ops):
        uid = op.uid
        if uid >= next_uid:
            next_uid = uid + 1
        if uid != i:
            in_place = False
        if op.start_ps is not None and op.dur_ps is not None:
            if window_start is None or op.start_ps < window_start:
                window_start = op.start_ps
    if window_start is None:
        trace.stats["gaps"] = 0
        return 0
    place_of = None if in_place else {op.uid: i for i, op in enumerate(ops)}
    # Per op, the place of the dependency that ended last (the first of those that ended
    # together; None: no timed dependency). PARENT edges say where an op started, not what it
    # waited for.
    released = [None] * n
    parent, order = _PARENT, _HOST_ORDER
    # An XLA device's edges are columns, read in place (making an Edge of each to read it
    # cost 3 % of a conversion); a PyTorch rank's are a list of Edge.
    edges = trace.edges
    columns = type(edges) is EdgeColumns
    if columns:
        srcs, dsts, kinds = edges.columns()
        edge_count = len(kinds)
    else:
        edge_list = edges if type(edges) is list else list(edges)
        edge_count = len(edge_list)
    for i in range(edge_count):
        if columns:
            if kinds[i] == parent:
                continue
            src, dst = srcs[i], dsts[i]
        else:
            e = edge_list[i]
            if e.kind == parent:
                continue
            src, dst = e.src, e.dst
        # (compiled, the places index as C integers; the list keeps the int objects it is
        # given, no new one an op)
        if place_of is None:
            src_place = src
            at_src, at_dst = src, dst
        else:
            src_place = place_of.get(src, -1)
            at_src, at_dst = src_place, place_of.get(dst, -1)
        if 0 <= at_src < n and 0 <= at_dst < n:
            op = ops[at_src]
            if op.start_ps is not None and op.dur_ps is not None:
                known = released[at_dst]
                if known is None:
                    released[at_dst] = src_place
                else:
                    end = _end(op, replay_dur)
                    dep = ops[known]
                    if end > _end(dep, replay_dur):
                        released[at_dst] = src_place
    compute_lanes = set()
    if per_resource:
        for op in ops:
            if (op.start_ps is not None and op.dur_ps is not None and op.on_device
                    and op.kind == _COMPUTE and dur(op)):
                compute_lanes.add(op.lane)
    # Each group's ops, and where an op's gap lane is not its own lane or the op does not
    # occupy its group (host-side and per-resource collectives, a few): uid -> (lane, occupies).
    groups: dict[str, list[Op]] = {}
    unusual: dict[int, tuple[str, bool]] = {}
    for op in ops:
        if op.start_ps is None or op.dur_ps is None:
            continue
        place = _placement(op, per_resource, dur, compute_lanes)
        if place is not None:
            key, lane, occupies = place
            members = groups.get(key)
            if members is None:
                members = groups[key] = []
            members.append(op)
            if lane is not op.lane or not occupies:
                unusual[op.uid] = (lane, occupies)
    added = gap_ps = 0
    new_ops, new_edges = trace.ops, trace.edges
    for members in groups.values():
        if not _in_start_order(members):
            # Where uids are places, members are in uid order: sorted by start alone, equal
            # starts stay so, the (start, uid) order without a tuple a member.
            members.sort(key=_START_PS if in_place else _START_UID)
        reach, before = window_start, -1  # the lane's (resource's) latest end, and whose
        for op in members:
            lane, occupies = op.lane, True
            if unusual:
                found = unusual.get(op.uid)
                if found is not None:
                    lane, occupies = found
            at = op.uid if place_of is None else place_of[op.uid]
            ready, released_from = reach, before
            known = released[at]
            if known is not None:
                dep = ops[known]
                latest = _end(dep, replay_dur)
                if latest > ready:
                    ready, released_from = latest, dep.uid
            slack = op.start_ps - ready
            on_device = op.on_device and occupies
            if slack >= (MIN_DEVICE_GAP_PS if on_device else MIN_GAP_PS):
                attrs = _GapAttrs()
                attrs.gap_ns = slack // 1000
                gap = Op(next_uid, GAP_NAME, _COMPUTE, on_device, lane, ready, slack, None,
                         None, None, None, None, attrs.__dict__)
                next_uid += 1
                new_ops.append(gap)
                if released_from >= 0:
                    new_edges.append(Edge(released_from, gap.uid, order))
                if before >= 0 and before != released_from:
                    new_edges.append(Edge(before, gap.uid, order))
                new_edges.append(Edge(gap.uid, op.uid, order))
                added += 1
                gap_ps += slack
            if occupies:
                end = _end(op, replay_dur)
                if end >= reach:
                    reach, before = end, op.uid
    trace.stats["gaps"] = added
    trace.stats["gap_ps"] = gap_ps
    return added


def _end(op: Op, replay_dur: Callable[[Op], int] | None) -> int:
    """A timed op's end as replayed (add_gaps)."""
    return op.start_ps + (op.dur_ps if replay_dur is None else replay_dur(op))


def _in_start_order(ops: list[Op]) -> bool:
    """Whether ``ops`` are sorted by (start, uid) already (on a lane they mostly are: the sort
    would make a key tuple per op only to leave them where they were)."""
    for i in range(1, len(ops)):
        a, b = ops[i - 1], ops[i]
        if a.start_ps > b.start_ps or (a.start_ps == b.start_ps and a.uid > b.uid):
            return False
    return True


_START_PS = attrgetter("start_ps")


def _START_UID(op: Op) -> tuple[int, int]:  # noqa: N802 (a sort key)
    return op.start_ps, op.uid


def _measured(op: Op) -> int:
    return op.dur_ps


def _placement(op: Op, per_resource: bool, dur: Callable[[Op], int], compute_lanes: set
               ) -> tuple[str, str, bool] | None:
    """(group, gap lane, whether the op occupies its group) for ``op``, or None: no gap."""
    if op.lane.startswith("comm:"):
        # A host-side collective: the time before its call is its calling thread's.
        caller = op.attrs.get("calling_lane")
        if not isinstance(caller, str):
            return None
        runner = op.attrs.get("gloo_thread")
        if runner is not None and not per_resource:
            # Run by a gloo thread from its start (linker/pytorch/link.py _gloo_execution):
            # the slack before it is that thread's, after the collective it ran before (drawn
            # on the calling thread). Per resource, the gloo thread is no resource of
            # ASTRA-sim's: a gap there would hold the host's.
            return f"gloo:{runner}", caller, True
        return ("host" if per_resource else caller), caller, False
    if not per_resource:
        return op.lane, op.lane, True
    if op.on_device and op.kind in _COMM_KINDS:
        # The network's resource. Its slack is a gap where its lane also computes (a TPU's
        # one XLA Ops line: nothing else ran there meanwhile); on a stream of its own (NCCL)
        # a gap would hold the compute resource against kernels that overlapped it.
        return ("device", op.lane, False) if op.lane in compute_lanes else None
    if op.on_device and op.dur_ps and not dur(op):
        return None  # replayed in no time at all: occupies nothing
    return ("device" if op.on_device else "host"), op.lane, True


WINDOW_ANCHOR = "window_anchor"
# A launches profile has an idle stretch for every other op: its attributes share their names.
_GapAttrs = shared_key_attrs("gap_ns", WINDOW_ANCHOR)


def add_window_anchor(trace: LinkedTrace) -> int | None:
    """A zero-length gap at the rank's window start that every op without a dependency waits
    for; returns its uid (None for a trace without times). The ranks of one run began
    recording at different moments (the corpus DLRM ranks up to 7.5 ms apart), which a
    simulator that starts every rank at zero would erase: the cross-rank step of ``--target
    astra-sim`` (converter/targets/astra_sim) gives each rank's anchor the time from the run's
    first start to its own, as unexplained slack."""
    timed = [op for op in trace.ops if op.start_ps is not None and op.dur_ps is not None]
    if not timed:
        return None
    edges = trace.edges
    if type(edges) is EdgeColumns:
        has_deps = set(edges.columns()[1])
    else:
        has_deps = set()
        for e in edges:
            has_deps.add(e.dst)
    start = min([op.start_ps for op in timed])
    attrs = _GapAttrs()
    attrs.gap_ns = 0
    setattr(attrs, WINDOW_ANCHOR, True)
    anchor = Op(max([op.uid for op in trace.ops]) + 1, GAP_NAME, _COMPUTE, False, "window",
                start, 0, attrs=attrs.__dict__)
    for op in timed:
        if op.uid not in has_deps:
            trace.edges.append(Edge(anchor.uid, op.uid, _HOST_ORDER))
    trace.ops.append(anchor)
    return anchor.uid
