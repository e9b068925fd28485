"""Host ops split where they launched or waited, so that every edge agrees with the clock.

A top-level host op (``aten::conv2d``, ``aten::to``, a compiled backward) is one range on its
thread, but the device work it launches starts while it still runs, and a blocking call inside
it (``cudaStreamSynchronize``, a synchronous ``cudaMemcpy``) waits for device work in its
middle. A Chakra dependency means "after the parent ended": a kernel made to depend on its
whole launching op would wait for that op's end (on the corpus ResNet rank 3,518 kernels did,
55 us late at the median), and an op that waited inside itself keeps the wait as its own
duration, so a faster device moves nothing.

So each such op is cut into consecutive parts on its thread, at

- a launch whose device op started before the host op ended: the part before the cut ends
  when the launch call returned (or, for a call that was still running when its device op
  started, when the call began), and the device op depends on that part;
- a blocking call (a synchronize, or a launch call that returned after its device op ended,
  as a synchronous copy does): the call's own time is removed; the part after it depends on
  the part before and on the device op(s) awaited, so the wait is an edge and what the edge
  does not explain is left to a gap (linker/enrich/gaps.py);
- a host-side collective nested in the op (gloo under an autograd op): it depends on the part
  that ends where it started, instead of on its parent's start (PARENT).

The first part keeps the op's uid, incoming edges and ET id; edges leaving the op that are not
tied to a cut leave from its last part. The first part says how many there are
(``segments``), the others which they are (``segment``: 1, 2, ...). Launches less than
``MERGE_LAUNCHES_PS`` after a cut share it. Ops without such points are left whole, so the number of nodes
grows only where the clock demanded it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from operator import itemgetter
from typing import TYPE_CHECKING

from chakra_hooks.linker.model import PS_PER_NS, Edge, EdgeKind, Op, OpKind

if TYPE_CHECKING:
    from chakra_hooks.linker.pytorch.link import PytorchLinker

# Idle time on a thread from which a wait for another thread is inferred: well above the
# time between two ops of a busy thread, well below a backward pass.
THREAD_WAIT_MIN_PS = 100_000_000  # 100 us
# A host-side collective's range may close this long after the thread waiting for it resumed
# (add_thread_waits).
WOKEN_LATE_PS = 2_000_000_000  # 2 ms
# Launches this close after a cut share it: their device ops depend on the part before the
# earlier cut, at most this much before their own launch (the device side's resolution,
# like linker/enrich/gaps.MIN_DEVICE_GAP_PS), and an op launching a few kernels in a row is cut
# once, not once per kernel.
MERGE_LAUNCHES_PS = 5_000_000  # 5 us
_LAUNCH, _PARENT, _SYNC, _HOST_ORDER = (EdgeKind.LAUNCH, EdgeKind.PARENT, EdgeKind.SYNC,
                                        EdgeKind.HOST_ORDER)
_COMPUTE = OpKind.COMPUTE  # bound once: an enum member read off its class costs ten globals
_FIRST = itemgetter(0)
_C_LAUNCH, _C_PARENT = _LAUNCH, _PARENT  # (C constants compiled: waits.pxd)


class _Cut:  # a C class when compiled (linker/pytorch/waits.pxd)
    """Where a host op is cut: the part before ends at ``a``, the part after starts at ``b``."""

    def __init__(self, a: int, b: int) -> None:
        self.a, self.b = a, b
        self.leaving: list[Edge] = []  # edges whose source becomes the part before the cut
        self.awaited: list[int] = []  # device op uids the part after the cut waits for


def split_host_ops(linker: PytorchLinker) -> None:
    """Cut host ops at their launches, waits and nested collectives (module docstring) and
    resolve the blocking calls recorded by linker/pytorch/edges.py into SYNC edges."""
    ops, edges = linker.ops, linker.edges
    cuts: dict[int, list[_Cut]] = defaultdict(list)
    runtime_of = {uid: rt for rt, uid, _ in linker.launches}
    for e in edges:
        kind = e.kind  # (compiled: a C integer, compared with C constants)
        if kind == _C_LAUNCH:
            _launch_cut(ops[e.src], ops[e.dst], runtime_of.get(e.dst), e, cuts)
        elif kind == _C_PARENT:
            host, child = ops[e.src], ops[e.dst]
            if _timed(host) and child.start_ps is not None:
                cut = _Cut(child.start_ps, child.start_ps)
                cut.leaving.append(e)
                cuts[host.uid].append(cut)
    _resolve_waits(linker, cuts)
    outgoing: dict[int, list[Edge]] = defaultdict(list)
    for e in edges:
        if e.src in cuts:
            outgoing[e.src].append(e)
    added = 0
    for uid, found in cuts.items():
        added += _apply(ops, edges, uid, found, outgoing[uid])
    linker.trace.stats["host_op_parts_added"] = added
    waits, woken_late = add_thread_waits(ops, edges)
    linker.trace.stats["thread_waits_by_clock"] = waits
    if woken_late:
        linker.trace.stats["comm_ends_at_waiter"] = woken_late


def add_thread_waits(ops: list[Op], edges: list[Edge]) -> tuple[int, int]:
    """A thread idle for ``THREAD_WAIT_MIN_PS`` or more between two of its ops, while another
    thread or a host-side collective worked, waited for it (the main thread blocked in
    ``backward()`` while autograd's thread ran it, or in a collective's ``wait()``): the op
    after the idle time depends on the op of another lane that ended nearest its start inside
    it. The trace records no such wait; the clock does (as in Lumos).

    A host-side collective's range closes after it woke its waiter: gloo marks the work done,
    the waiting thread resumes, then the gloo thread ends its range (0.4-0.5 ms later under
    DDP on 2 loaded cores, where the main thread waits for each bucket in turn). So a
    collective that ends up to ``WOKEN_LATE_PS`` after the waiter resumed, nearer than any
    op inside the idle time, is what it waited for: its end is moved to the resume (counted,
    ``comm_ends_at_waiter``), and the edge agrees with the clock. Returns how many edges, and
    how many of them such collectives."""
    lanes: dict[str, list[Op]] = defaultdict(list)
    done: list[tuple[int, int, str]] = []  # (end, uid, lane) of every timed host-side op
    comm: list[Op] = []
    for op in ops:
        if op.start_ps is None or op.dur_ps is None:
            continue
        lane = op.lane
        if lane.startswith("thread:") and not op.on_device:
            lanes[lane].append(op)
            done.append((op.start_ps + op.dur_ps, op.uid, lane))
        elif lane.startswith("comm:"):
            done.append((op.start_ps + op.dur_ps, op.uid, lane))
            comm.append(op)
    if len(lanes) + (1 if comm else 0) < 2:
        return 0, 0
    # By end; equal ends stay in uid order, as `ops` is (a uid is its op's place): the order
    # of sorting the tuples whole, without comparing tuples.
    done.sort(key=_FIRST)
    ends = [entry[0] for entry in done]
    comm.sort(key=_END)
    comm_ends = [op.start_ps + op.dur_ps for op in comm]
    added = 0
    woken_late = 0
    for lane, members in lanes.items():
        members.sort(key=_START)
        for a, b in zip(members, members[1:]):
            idle_from = a.start_ps + a.dur_ps
            resumed = b.start_ps
            if resumed - idle_from < THREAD_WAIT_MIN_PS:
                continue
            inside = None
            i = bisect_right(ends, resumed) - 1
            while i >= 0 and ends[i] > idle_from:
                if done[i][2] != lane:
                    inside = i
                    break
                i -= 1
            j = bisect_right(comm_ends, resumed)
            late = comm[j] if j < len(comm) and comm_ends[j] <= resumed + WOKEN_LATE_PS \
                and comm[j].start_ps < resumed else None
            if late is not None and (inside is None
                                     or comm_ends[j] - resumed < resumed - ends[inside]):
                late.dur_ps = resumed - late.start_ps
                comm_ends[j] = resumed
                edges.append(Edge(late.uid, b.uid, _SYNC))
                added += 1
                woken_late += 1
            elif inside is not None:
                edges.append(Edge(done[inside][1], b.uid, _SYNC))
                added += 1
    return added, woken_late


def _timed(op: Op) -> bool:
    return op.start_ps is not None and op.dur_ps is not None


def _launch_cut(host: Op, device: Op, runtime: object, edge: Edge,
                cuts: dict[int, list[_Cut]]) -> None:
    if host.on_device or not _timed(host) or not _timed(device):
        return
    end = host.start_ps + host.dur_ps
    if device.start_ps >= end:
        return  # the device op began after its launcher ended: the edge holds as it is
    if runtime is None:
        cut = _Cut(device.start_ps, device.start_ps)
    else:
        r0, r1 = runtime.start * PS_PER_NS, (runtime.start + runtime.dur) * PS_PER_NS
        if r1 <= device.start_ps:  # the usual asynchronous launch
            cut = _Cut(r1, r1)
        elif r1 >= device.start_ps + device.dur_ps:  # returned after its work ended: blocking
            cut = _Cut(r0, r1)
            cut.awaited.append(device.uid)
        else:  # still running when its work began, returned before it ended
            point = min(r0, device.start_ps)
            cut = _Cut(point, point)
    cut.leaving.append(edge)
    cuts[host.uid].append(cut)


def _resolve_waits(linker: PytorchLinker, cuts: dict[int, list[_Cut]]) -> None:
    """Each blocking call (thread, call start, call end, awaited device uids): inside a host
    op, a cut of that op; between ops, SYNC edges to the first op that starts after it."""
    waits = getattr(linker, "host_waits", None)
    if not waits:
        return
    ops, edges = linker.ops, linker.edges
    index: dict[tuple, tuple[list[int], list[int]]] = {}
    for key, entries in linker.thread_ops.items():
        on_host = sorted([entry for entry in entries if not ops[entry[1]].on_device])
        index[key] = ([entry[0] for entry in on_host], [entry[1] for entry in on_host])
    for key, c0, c1, awaited in waits:
        found = index.get(key)
        if found is None or not awaited:
            continue
        starts, uids = found
        i = bisect_right(starts, c0) - 1
        if i >= 0:
            host = ops[uids[i]]
            if _timed(host) and host.start_ps + host.dur_ps >= c1 * PS_PER_NS:
                cut = _Cut(c0 * PS_PER_NS, c1 * PS_PER_NS)
                cut.awaited.extend(awaited)
                cuts[host.uid].append(cut)
                continue
        j = bisect_left(starts, c1)
        if j < len(starts):
            for src in awaited:
                edges.append(Edge(src, uids[j], _SYNC))


def _END(op: Op) -> int:  # noqa: N802 (a sort key)
    return op.start_ps + op.dur_ps


def _START(op: Op) -> int:  # noqa: N802 (a sort key)
    return op.start_ps


def _AT(cut: _Cut) -> tuple[int, int]:  # noqa: N802 (a sort key)
    return cut.a, cut.b


def _apply(ops: list[Op], edges: list[Edge], uid: int, found: list[_Cut],
           leaving: list[Edge]) -> int:
    """Cut ``ops[uid]`` at ``found``; returns how many parts were added."""
    host = ops[uid]
    start, end = host.start_ps, host.start_ps + host.dur_ps
    merged: list[_Cut] = []
    for cut in (found if len(found) == 1 else sorted(found, key=_AT)):
        # each end within the op, and b not before a (comparisons: min and max were calls)
        a, b = cut.a, cut.b
        if a < start:
            a = start
        if a > end:
            a = end
        if b < start:
            b = start
        if b > end:
            b = end
        if b < a:
            b = a
        cut.a, cut.b = a, b
        last = merged[-1] if merged else None
        if last is not None and (cut.a < last.b or (cut.a == last.a and cut.b == last.b) or (
                not cut.awaited and cut.a - last.b < MERGE_LAUNCHES_PS)):
            last.b = max(last.b, cut.b)
            last.leaving.extend(cut.leaving)
            last.awaited.extend(cut.awaited)
        else:
            merged.append(cut)
    tied = set()
    for cut in merged:
        for e in cut.leaving:
            tied.add(id(e))
    parts = [host]
    host.dur_ps = merged[0].a - start
    for i, cut in enumerate(merged):
        before = parts[-1]
        nxt = merged[i + 1].a if i + 1 < len(merged) else end
        part = Op(len(ops), host.name, _COMPUTE, False, host.lane, cut.b, nxt - cut.b)
        part.attrs["segment"] = i + 1
        ops.append(part)
        parts.append(part)
        for e in cut.leaving:
            e.src = before.uid
            if e.kind == _PARENT:
                e.kind = _HOST_ORDER
        edges.append(Edge(before.uid, part.uid, _HOST_ORDER))
        if cut.awaited:
            for w in dict.fromkeys(cut.awaited):
                edges.append(Edge(w, part.uid, _SYNC))
    tail = parts[-1].uid
    for e in leaving:  # what the op's end released now leaves from its last part
        if id(e) not in tied:
            e.src = tail
    host.attrs["segments"] = len(parts)
    return len(parts) - 1
