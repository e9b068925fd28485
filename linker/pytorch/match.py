"""Match host ET nodes to Kineto host ranges, and index Kineto ranges by thread and time.

Three keys, tried in this order and the one that matches most (by name too) wins:

1. ET ``rf_id`` == Kineto ``Record function id`` (the observer ran with the profiler, newer
   PyTorch);
2. ET ``rf_id`` == Kineto ``External id`` (older pairs);
3. the ordered sequence of op names per thread (oldest pairs, or ids that drifted). ET threads
   are paired with Kineto threads by name overlap; each alignment walks forward with a small
   look-ahead, skipping ranges one side has and the other lacks, and is tried from every
   plausible start (bounded), so that when Kineto covers many steps and the ET one, the
   ET's own step is found.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from operator import attrgetter

try:  # read by Cython when it compiles this module (setup.py): see KThread.innermost
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

from chakra_hooks.linker.pytorch.kineto_events import KEvent
from chakra_hooks.linker.pytorch.et import HostEt
from chakra_hooks.linker.pytorch.et_nodes import EtNode

LOOKAHEAD = 16
ANCHOR_PROBE = 8  # leading names that must agree for a start to be tried
MAX_STARTS = 256  # starts tried per thread
SCORE_PREFIX = 4096  # ET nodes aligned to score one start


@dataclass  # slotted by linker/pytorch/match.pxd when compiled (a C class)
class KThread:
    """Host ranges of one Kineto thread, in entry order, with their nesting filled in."""

    key: tuple
    events: list[KEvent]
    starts: list[int]
    # op calls (cpu_op) that ended after the range they are in: cut to its end (index_threads)
    clipped: list[KEvent]

    def innermost(self, t: int) -> KEvent | None:
        """The innermost range open at time ``t`` (start <= t <= end), or None. (Compiled,
        on C integers, match.pxd: Kineto's times are below 2^62 ns, the reader's check.)"""
        starts = self.starts
        if cython.compiled:  # bisect_right, comparing C integers (it compared int objects)
            lo, hi = 0, len(starts)
            while lo < hi:
                mid = (lo + hi) // 2
                start = starts[mid]
                if t < start:
                    hi = mid
                else:
                    lo = mid + 1
            i = lo - 1
        else:
            i = bisect_right(starts, t) - 1
        ev = self.events[i] if i >= 0 else None
        while ev is not None:
            start = ev.start
            dur = ev.dur
            if start + dur >= t:
                break
            ev = ev.parent
        return ev


def index_threads(host: list[KEvent]) -> dict[tuple, KThread]:
    """Group host ranges by (pid, tid), sort them in entry order and set ``parent``."""
    groups: dict[tuple, list[KEvent]] = defaultdict(list)
    # A thread's ranges come in runs, and the reader shares one pid and one tid object per
    # value: the list of the run's thread is looked up (a key tuple made and hashed) once
    # per run, not per range.
    last_pid = last_tid = members = None
    for ev in host:
        if ev.pid is not last_pid or ev.tid is not last_tid or members is None:
            last_pid, last_tid = ev.pid, ev.tid
            members = groups[(last_pid, last_tid)]
        members.append(ev)
    threads = {}
    for key, events in groups.items():
        # Entry order: earlier start first; at equal starts the longer (enclosing) range first.
        # (By start, then the runs of equal starts by duration: the events come nearly in
        # start order already, which timsort makes linear; sorting by duration first would
        # scramble them, and a key tuple per event cost more than the whole sort.)
        events.sort(key=_START)
        _longer_first_at_equal_starts(events)
        stack: list[KEvent] = []
        ends: list[int] = []  # where each range on the stack ends (read once, not per test)
        clipped: list[KEvent] = []
        for ev in events:
            start = ev.start
            while ends and ends[-1] <= start:
                stack.pop()
                ends.pop()
            ev.parent = stack[-1] if stack else None
            end = start + ev.dur
            if ends and end > ends[-1] and ev.cat == "cpu_op":
                # An op call returns before the call or range it was made in ends (calls
                # nest); one that does not has a damaged duration, which would make the ops
                # after its parent its children. (Async ranges, gloo's, may outlive theirs.)
                end = ends[-1]
                ev.dur = end - start
                clipped.append(ev)
            stack.append(ev)
            ends.append(end)
        starts = []
        for ev in events:
            starts.append(ev.start)
        threads[key] = KThread(key, events, starts, clipped)
    return threads


_START = attrgetter("start")


def _longer_first_at_equal_starts(events: list[KEvent]) -> None:
    """In events sorted by start, each run of equal starts sorted longest first (stable:
    with the sort by start, a stable sort by (start, -dur))."""
    count = len(events)
    i = 0
    while i < count - 1:
        ev = events[i]
        start = ev.start
        j = i + 1
        while j < count:
            ev = events[j]
            if ev.start != start:
                break
            j += 1
        if j - i > 1:
            events[i:j] = sorted(events[i:j], key=_longest_first)
        i = j


def _longest_first(ev: KEvent) -> int:
    return -ev.dur


@dataclass(slots=True)
class Match:
    by_et: dict[int, KEvent] = field(default_factory=dict)
    strategy: str = "none"
    eligible: int = 0  # ET nodes that could match (all but the roots)
    released: int | None = None  # how many matched, once by_et is let go (release)

    @property
    def matched(self) -> int:
        return len(self.by_et) if self.released is None else self.released

    @property
    def rate(self) -> float:
        return self.matched / self.eligible if self.eligible else 0.0

    def release(self) -> None:
        """Let go of the matched events (the linker is done reading them); counts stay."""
        self.released = self.matched
        self.by_et = {}


def _by_key(nodes: list[EtNode], host: list[KEvent], key: str) -> dict[int, KEvent]:
    """Match by one KArgs attribute (``record_function_id`` or ``external_id``) and name."""
    # (Plain loops, not comprehensions: the compiled build types `ev` and `node`.)
    get_key = attrgetter(key)
    index = {}
    for ev in host:
        k = get_key(ev.args)
        if k and type(k) is int:  # an id; anything else (damage) links nothing
            index[k] = ev  # the last range of a key wins
    get = index.get
    out = {}
    for node in nodes:
        rf_id = node.rf_id
        if rf_id and type(rf_id) is int:
            ev = get(rf_id)
            if ev is not None and ev.name == node.name:
                out[node.id] = ev
    return out


def match_et(et: HostEt, host: list[KEvent], threads: dict[tuple, KThread]) -> Match:
    """Match ET nodes to Kineto host ranges with the best of the three keys."""
    roots = et.roots
    nodes = []
    for node in et.nodes:
        if node.id not in roots:
            nodes.append(node)
    best = Match(eligible=len(nodes))
    if _has_record_function_ids(host[:2000]):
        best = Match(_by_key(nodes, host, "record_function_id"), "record_function_id", len(nodes))
    if best.rate < 0.9:
        by_ext = Match(_by_key(nodes, host, "external_id"), "external_id", len(nodes))
        best = by_ext if len(by_ext.by_et) > len(best.by_et) else best
    if best.rate < 0.9:
        by_seq = Match(_by_sequence(nodes, threads), "name_sequence", len(nodes))
        best = by_seq if len(by_seq.by_et) > len(best.by_et) else best
    for et_id, ev in best.by_et.items():
        ev.et = et_id  # an id, not the node: the linker lets the nodes go before the events
    return best


def _has_record_function_ids(host: list[KEvent]) -> bool:
    for ev in host:
        if ev.args.record_function_id:
            return True
    return False


def _by_sequence(nodes: list[EtNode], threads: dict[tuple, KThread]) -> dict[int, KEvent]:
    """Match by name sequence, in ONE window for all threads.

    The ET thread that was recorded first (the training loop's, whose forward pass comes
    before autograd's backward) is aligned first, at its best start among the steps Kineto
    recorded; from its first matched range to where its next step starts is the window, and
    every other ET thread is aligned only with Kineto ranges inside it. Aligned on its own,
    the backward thread could match another step (the first step often scores best: nothing
    to accumulate yet), linking backward ops to ranges before their own forward, and device
    work of other steps into the ET.
    """
    per_tid: dict[int, list[EtNode]] = defaultdict(list)
    for n in nodes:
        per_tid[n.tid].append(n)
    used: set[tuple] = set()
    have = {key: Counter(e.name for e in th.events) for key, th in threads.items()}
    paired: dict[int, tuple] = {}  # ET tid -> Kineto thread; largest ET threads pick first
    for tid, seq in sorted(per_tid.items(), key=lambda kv: -len(kv[1])):
        want = Counter(n.name for n in seq)
        best_key, best_score = None, 0
        for key in threads:
            if key in used:
                continue
            score = sum((want & have[key]).values())
            if score > best_score:
                best_key, best_score = key, score
        if best_key is not None:
            used.add(best_key)
            paired[tid] = best_key
    if not paired:
        return {}
    # The anchor: of the threads holding a tenth of the ET or more, the one recorded first
    # (ET ids follow the order ops were recorded in, across threads).
    big = [tid for tid in paired if len(per_tid[tid]) * 10 >= len(nodes)] or list(paired)
    anchor = min(big, key=lambda tid: per_tid[tid][0].id)
    out, window = _best_alignment(per_tid[anchor], threads[paired[anchor]].events)
    lo, hi = window
    for tid, key in paired.items():
        if tid != anchor:
            inside = [e for e in threads[key].events if lo <= e.start < hi]
            out.update(_best_alignment(per_tid[tid], inside)[0])
    return out


def _best_alignment(seq: list[EtNode], events: list[KEvent]
                    ) -> tuple[dict[int, KEvent], tuple[int, int]]:
    """Align ``seq`` from each plausible start in ``events`` and keep the best alignment;
    returns it and its window: from its first matched range to the next plausible start
    after its last one (the next step), or to the end of the trace.

    Starts are where the first names of the ET thread appear in order; when Kineto recorded
    many identical steps, the one that aligns with most ET nodes wins (the first step often
    differs: no gradients to zero or accumulate yet), ties going to the start whose
    ``External id`` is closest to the ET's ``rf_id``.
    """
    if not seq or not events:
        return {}, (0, 0)
    probe = [n.name for n in seq[:ANCHOR_PROBE]]
    width = len(probe)
    candidates = [j for j, e in enumerate(events) if e.name == probe[0]
                  and [x.name for x in events[j:j + width]] == probe][:MAX_STARTS]
    if not candidates:
        candidates = [j for j, e in enumerate(events) if e.name == probe[0]][:MAX_STARTS] or [0]
    # Each start is scored on a bounded prefix, so the work stays linear in the trace size.
    prefix = seq[:SCORE_PREFIX]
    best_j, best_key = candidates[0], (-1, 0)
    for j in candidates:
        scored: dict[int, KEvent] = {}
        _align(prefix, events, j, scored)
        ext = events[j].args.external_id
        key = (len(scored), -abs(ext - seq[0].rf_id) if isinstance(ext, int) else 0)
        if key > best_key:
            best_j, best_key = j, key
    out: dict[int, KEvent] = {}
    last = _align(seq, events, best_j, out)
    if not out:
        return out, (0, 0)
    first = min(ev.start for ev in out.values())
    following = [j for j in candidates if j > last]
    end = events[following[0]].start if following else max(e.start + e.dur for e in events) + 1
    return out, (first, end)


def _align(seq: list[EtNode], events: list[KEvent], j: int, out: dict[int, KEvent]) -> int:
    """Greedy forward alignment of two name sequences with a bounded look-ahead; returns the
    index of the last event matched (``j - 1`` if none). Matches only move forward in both
    sequences, so no op is linked to a range before that of an op it follows."""
    i = 0
    last = j - 1
    n_seq, n_ev = len(seq), len(events)
    while i < n_seq and j < n_ev:
        name = seq[i].name
        if name == events[j].name:
            out[seq[i].id] = events[j]
            last = j
            i += 1
            j += 1
            continue
        skip_ev = next((k for k in range(1, LOOKAHEAD) if j + k < n_ev
                        and events[j + k].name == name), 0)
        skip_et = next((k for k in range(1, LOOKAHEAD) if i + k < n_seq
                        and seq[i + k].name == events[j].name), 0)
        if skip_ev and (not skip_et or skip_ev <= skip_et):
            j += skip_ev
        elif skip_et:
            i += skip_et
        else:
            i += 1  # an ET node Kineto did not record here: keep Kineto's place
    return last
