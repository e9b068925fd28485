"""``share --level times``: each duration perturbed within the bound, and each start moved
with what it waited for, so that no recorded duration can be read back from the starts kept.

Perturbing durations alone leaves them in the starts: wherever a lane runs back to back, the
next node's start minus a node's own is its recorded duration (half the ops or more of a
recorded run). So the shared run is re-timed as a whole, in picoseconds:

- a node's duration is multiplied by 1 + u, u uniform in [-bound, +bound], drawn per node
  from the sharer's key (keyed: without the key the factor cannot be worked out and divided
  away); where the rounding to the node's unit gives back the recorded duration, it is one
  unit off instead (a node shorter than 1 / bound units cannot move less than that);
- a node starts as late as its recorded start plus the drift of what it waited for: the
  dependency or lane predecessor that ended last before it started (the one that released
  it) passes on how much later, or earlier, it now ends, and no other predecessor may end
  after the node starts that ended before it in the recording. The slack between a node and
  what released it is kept; a node nothing released keeps its start;
- a matched collective (or send / receive pair) ends its transfer, perturbed, after its last
  member arrives on the new times: its members' waits for each other follow their arrivals.

Every order of the recording (on a lane, along a dependency, between a collective's members)
holds, so replays, ``stats`` and the checkers read the same run with durations within the
bound; the drift a chain of nodes accumulates is the sum of their perturbations, so a run's
span moves by far less than the bound.
"""

from __future__ import annotations

import hashlib
import hmac
import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import etio
from .peers import Peers
from .run_model import PS_PER_UNIT, Rank, node_time_fields

NONE = -(1 << 63)  # an untimed node's start


def noise(key: bytes, seed: int, rank: int, node_id: int, bound: float) -> float:
    """A node's duration factor, 1 + u with u uniform in [-bound, +bound), keyed."""
    digest = hmac.new(key, f"times\0{seed}\0{rank}\0{node_id}".encode(), hashlib.sha256).digest()
    u = int.from_bytes(digest[:8], "little") / 2**64
    return 1.0 + bound * (2.0 * u - 1.0)


_TIME_ATTRS = frozenset(("start_ns", "duration_ns", "start_ps", "duration_ps",
                         "duration_unknown"))


def exact_times(path: str) -> tuple[list[tuple[int, int | None, int]], int | None]:
    """Each node's (ps per unit, start, duration) of one ET, as the run tools read them
    (run_model.node_time_fields), and its earliest start in ps."""
    out = []
    first = None
    for node in etio.read_et(path).nodes:
        attrs = {a.name: a for a in node.attr if a.name in _TIME_ATTRS}
        per, start, dur = node_time_fields(node, attrs)
        start = None if start is None else int(start)
        out.append((per, start, int(dur)))
        if start is not None:
            ps = start * per
            first = ps if first is None or ps < first else first
    return out, first


@dataclass
class Retimed:
    """Per rank index and position: the new start (ps from ``base``; ``NONE``: untimed), the
    new duration (ps), the unit each is written in; matched collectives' new waits (ps)."""

    base: int
    unit: list[array]
    start: list[array]
    dur: list[array]
    wait: list[dict[int, int]]
    factor: list[array]
    recorded_start: list[array]
    recorded_dur: list[array]


def _perturbed(dur: int, unit: int, factor: float) -> int:
    """A duration (ps, a whole number of ``unit``) times ``factor``, rounded to the unit and
    never the recorded one (one unit off where the rounding gives it back)."""
    units = dur // unit
    if units <= 0:
        return dur
    new = round(units * factor)
    if new == units:
        new = units + 1 if factor >= 1.0 else units - 1
    return max(new, 0) * unit


def retime(paths: Sequence[str], ranks: Sequence[Rank], peers: Peers, key: bytes, seed: int,
           bound: float) -> Retimed:
    """The run's new times (module docstring)."""
    read = [exact_times(str(p)) for p in paths]
    firsts = [f for _, f in read if f is not None]
    base = (min(firsts) // PS_PER_UNIT["us"]) * PS_PER_UNIT["us"] if firsts else 0
    n_ranks = len(ranks)
    units, starts, durs = [], [], []
    for times, _ in read:
        unit, start, dur = array("q"), array("q"), array("q")
        for scale, s, d in times:
            unit.append(scale)
            start.append(NONE if s is None else s * scale - base)
            dur.append(d * scale)
        units.append(unit)
        starts.append(start)
        durs.append(dur)
    offset = [round(peers.offsets_us.get(r.rank, 0.0) * 1e6) for r in ranks]
    factor = [array("d", (noise(key, seed, r.rank, nid, bound) for nid in r.columns.ids))
              for r in ranks]
    new_dur = [array("q", (_perturbed(d, u, f) for d, u, f in zip(durs[i], units[i], factor[i])))
               for i in range(n_ranks)]
    shift = [array("q", bytes(8 * len(r.columns))) for r in ranks]
    known = [bytearray(len(r.columns)) for r in ranks]
    wait: list[dict[int, int]] = [{} for _ in ranks]

    # Collectives: position -> its column's members (rank index, position).
    index_of = {r.rank: i for i, r in enumerate(ranks)}
    column_of: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for column in peers.columns:
        members = [(index_of[rank], ranks[index_of[rank]].position(nid)) for rank, nid in column]
        if all(starts[i][p] != NONE for i, p in members):
            for member in members:
                column_of[member] = members
    ended: dict[tuple[int, int], int] = {}  # a collective member's new end delta (ps)

    def corrected_start(i: int, p: int) -> int:
        return starts[i][p] - offset[i]

    def end_delta(i: int, p: int) -> int:
        """How much later (ps) node p of rank index i now ends than it did."""
        members = column_of.get((i, p))
        if members is None:
            return shift[i][p] + new_dur[i][p] - durs[i][p]
        found = ended.get((i, p))
        if found is not None:
            return found
        last = max(corrected_start(j, q) for j, q in members)
        last_new = max(corrected_start(j, q) + shift[j][q] for j, q in members)
        for j, q in members:
            transfer = corrected_start(j, q) + durs[j][q] - last
            if transfer < 0:  # it ended before the last arrived (clocks): its own perturbation
                delta = shift[j][q] + new_dur[j][q] - durs[j][q]
            else:
                moved = _perturbed(transfer, units[j][q], factor[j][q]) if transfer else 0
                delta = (last_new - last) + (moved - transfer)
                dur = durs[j][q] + delta - shift[j][q]
                if dur == durs[j][q] and dur:  # the recorded duration given back: a unit off
                    delta += units[j][q]
                    dur += units[j][q]
                new_dur[j][q] = max(dur, 0)
                wait[j][q] = max(last_new - corrected_start(j, q) - shift[j][q], 0)
            ended[(j, q)] = delta
        return ended[(i, p)]

    # Every timed node of the run, by its start on the corrected clocks (then its end).
    order = sorted(((corrected_start(i, p), corrected_start(i, p) + durs[i][p], i, p)
                    for i in range(n_ranks) for p in range(len(starts[i]))
                    if starts[i][p] != NONE))
    lanes: dict[tuple[int, int], tuple[list, list]] = {}  # (rank, lane) -> (running, [done])
    for s, _, i, p in order:
        c = ranks[i].columns
        preds = [c.deps[k] for k in range(c.dep_at[p], c.dep_at[p + 1])]
        before: list[int] = []  # the node that started last on its lane before this one
        lane = c.lanes[p]
        if lane >= 0:
            running, done = lanes.setdefault((i, lane), ([], [None, None]))
            while running and running[0][0] <= s:
                end, q = heapq.heappop(running)
                if done[0] is None or end >= done[0][0]:
                    done[0] = (end, q)
            if done[0] is not None:
                preds.append(done[0][1])
            if done[1] is not None:
                before.append(done[1])
            done[1] = p
            heapq.heappush(running, (s + durs[i][p], p))
        released, lower, moved = None, None, 0
        for q in preds:
            if starts[i][q] == NONE or not known[i][q]:
                continue
            end = corrected_start(i, q) + durs[i][q]
            if end > s:  # it had not ended when this node started: no order to keep
                continue
            delta = end_delta(i, q)
            lower = delta - (s - end) if lower is None else max(lower, delta - (s - end))
            if released is None or end > released or end == released and delta > moved:
                released, moved = end, delta
        shift[i][p] = 0 if released is None else max(moved, lower)
        # Where this start minus an earlier one gives that node's recorded duration back (the
        # slack after it equal to its perturbation), one unit later.
        for q in (*preds, *before):
            if known[i][q] and durs[i][q] > 0 and (
                    starts[i][p] + shift[i][p] - starts[i][q] - shift[i][q]) == durs[i][q]:
                shift[i][p] += units[i][p]
        known[i][p] = 1
    for i in range(n_ranks):  # collectives nothing after them asked for
        for p in range(len(starts[i])):
            if (i, p) in column_of and (i, p) not in ended:
                end_delta(i, p)
    new_start = [array("q", (NONE if s == NONE else s + d for s, d in zip(starts[i], shift[i])))
                 for i in range(n_ranks)]
    return Retimed(base, units, new_start, new_dur, wait, factor, starts, durs)


def _set_int(node, name: str, value: int) -> None:
    for attr in node.attr:
        if attr.name == name:
            setattr(attr, attr.WhichOneof("value"), value)


def apply(node, retimed: Retimed, i: int, p: int, scaled_attrs) -> None:
    """Node p of rank index i with its new times: its start and duration in every field that
    holds them (its finest unit and whole microseconds), ``issued_ns`` moved with its start,
    a matched collective's ``peer_wait_ns`` its new wait, and the attributes ``scaled_attrs``
    matches (other durations: a gap's, a call's queueing) scaled with its duration."""
    from .graph import round_us

    unit = retimed.unit[i][p]
    start, dur = retimed.start[i][p], retimed.dur[i][p]
    was_start, was_dur = retimed.recorded_start[i][p], retimed.recorded_dur[i][p]
    factor = dur / was_dur if was_dur else retimed.factor[i][p]
    base = retimed.base
    names = {a.name for a in node.attr}
    if unit == PS_PER_UNIT["us"]:
        if start != NONE:
            node.start_time_micros = (base + start) // unit
        if "duration_unknown" not in names:
            node.duration_micros = dur // unit
    else:
        suffix = "ns" if unit == PS_PER_UNIT["ns"] else "ps"
        if start != NONE:
            _set_int(node, f"start_{suffix}", (base + start) // unit)
        _set_int(node, f"duration_{suffix}", dur // unit)
        if start != NONE and node.start_time_micros:
            old_us = round_us(base + was_start)
            if node.duration_micros == round_us(base + was_start + was_dur) - old_us:
                node.start_time_micros = round_us(base + start)
                node.duration_micros = round_us(base + start + dur) - node.start_time_micros
            else:  # a duration of its own (--target astra-sim's overlapped nodes: 0)
                node.start_time_micros = round_us(base + start)
                node.duration_micros = round(node.duration_micros * factor)
        elif node.duration_micros:
            node.duration_micros = round(node.duration_micros * factor)
    moved = 0 if start == NONE else start - was_start
    wait = retimed.wait[i].get(p)
    for attr in node.attr:
        kind = attr.WhichOneof("value")
        if kind not in ("int64_val", "uint64_val", "int32_val", "uint32_val", "float_val",
                        "double_val") or attr.name.startswith(("start_", "duration_")):
            continue
        if attr.name == "issued_ns":
            setattr(attr, kind, getattr(attr, kind) + round(moved / 1000))
        elif attr.name == "peer_wait_ns" and wait is not None:
            setattr(attr, kind, round(wait / 1000))
        elif scaled_attrs.search(attr.name):
            scaled = getattr(attr, kind) * factor
            setattr(attr, kind, scaled if kind in ("float_val", "double_val") else round(scaled))


@dataclass
class Recovered:
    """Of the nodes with a recorded duration, how many can be read back exactly (at their
    finest unit) from a shared run, and a few of them (rank, node id, how)."""

    count: int = 0
    of: int = 0
    examples: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.count / self.of if self.of else 0.0


def recoverable(originals: Sequence[str], shared: Sequence[str]) -> Recovered:
    """How many recorded durations of ``originals`` (a conversion's ETs) the shared ETs of the
    same ranks give back exactly: as a node's own duration, or as the next start on its lane
    or a dependent's start minus its own (where they ran back to back)."""
    from .run_model import read_run

    ranks = read_run(list(shared))[0]
    out = Recovered()
    for r, before, after in zip(ranks, originals, shared):
        recorded, _ = exact_times(str(before))
        now, _ = exact_times(str(after))
        c = r.columns
        if len(recorded) != len(now):
            raise ValueError(f"{after}: {len(now)} nodes, but {before} has {len(recorded)}")
        starts = [None if s is None else s * per for per, s, _ in now]
        user_at, users = c.users()
        following: dict[int, int] = {}  # position -> the next start on its lane
        by_lane: dict[int, list[int]] = {}
        for p in range(len(c)):
            if c.lanes[p] >= 0 and starts[p] is not None:
                by_lane.setdefault(c.lanes[p], []).append(p)
        for members in by_lane.values():
            members.sort(key=lambda p: (starts[p], c.ids[p]))
            for a, b in zip(members, members[1:]):
                following[a] = b
        for p, (per, _, dur) in enumerate(recorded):
            if dur <= 0:
                continue
            out.of += 1
            wanted = dur * per
            how = None
            if now[p][2] * now[p][0] == wanted:
                how = "its own duration"
            elif starts[p] is not None:
                later = [following[p]] if p in following else []
                later += [users[k] for k in range(user_at[p], user_at[p + 1])]
                for q in later:
                    if starts[q] is not None and starts[q] - starts[p] == wanted:
                        how = f"the start of node {c.ids[q]} minus its own"
                        break
            if how is not None:
                out.count += 1
                if len(out.examples) < 5:
                    out.examples.append((r.rank, c.ids[p], how))
    return out
