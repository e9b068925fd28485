"""``chakra-hooks whatif``: replay a converted run with communication or compute changed.

Each rank's ET is replayed as a simulator without resource limits would: a node starts when
all its dependencies (data and ctrl) have ended and lasts its duration; threads and streams
keep their order through the ET's own order edges, and gaps (slack, linker/enrich/gaps.py) keep their
length. Durations are changed by:

- ``comm``: a factor for every communication node (COMM_COLL / SEND / RECV, host-side gloo
  collectives included), or per collective type (``all_reduce=0.5``);
- ``compute``: a factor for every compute node other than gaps (host ops and kernels alike);
- ``comm_from``: another conversion of the same program (the same collectives in the same order
  per rank): each collective takes the duration measured there, as a ground-truth what-if.

``replay`` replays one rank alone: a collective's measured time includes waiting for its
slowest peer, so scaling it scales that wait too. ``replay_run`` replays the ranks of a run
together (converter/peers.py): a collective matched across its group's members starts its
transfer when the last member reaches it in the replay, and lasts its measured transfer
(scaled by ``comm``, or taken from the other run with ``comm_from``), so waits for peers grow
and shrink with what the peers do and are never scaled; a collective whose members were not
all recorded keeps the one-rank model. ``only`` applies the change to some ranks (a straggler
made faster). The predicted span of a rank is the replay's finish; what moved is the critical
path's make-up before and after (``peer``: time on the path spent on other ranks' nodes).
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import peers as run_peers
from .run_model import Columns, Rank, longest_path
from .schema import COMM_COLL, COMM_RECV, COMM_SEND, CollectiveCommType, Node
from .stats import span_of

_COMM = frozenset((COMM_COLL, COMM_SEND, COMM_RECV))
COMM_TYPES = {CollectiveCommType.Name(v).lower(): v for v in CollectiveCommType.values()}
KINDS = ("compute", "comm", "gap")
UNRESOLVED = "comm_unresolved"
RUN_KINDS = (*KINDS, "peer")


@dataclass(frozen=True)
class Change:
    """How durations change: factors (1.0 = as measured)."""

    comm: float = 1.0
    compute: float = 1.0
    comm_by_type: Mapping[int, float] | None = None  # CollectiveCommType -> factor

    def describe(self) -> str:
        parts = []
        if self.comm != 1.0:
            parts.append(f"communication x{self.comm:g}")
        for ctype, factor in (self.comm_by_type or {}).items():
            parts.append(f"{CollectiveCommType.Name(ctype).lower()} x{factor:g}")
        if self.compute != 1.0:
            parts.append(f"compute x{self.compute:g}")
        return ", ".join(parts) or "nothing changed"


@dataclass
class RankWhatIf:
    path: str
    span_us: float  # measured window
    replayed_us: float  # replay with measured durations
    predicted_us: float  # replay with the change
    before_us: dict[str, float]  # critical path by kind, measured durations
    after_us: dict[str, float]  # critical path by kind, changed durations
    rank: int | None = None  # where replayed with its run

    def to_json(self) -> dict:
        return {**({"rank": self.rank} if self.rank is not None else {}),
                "path": self.path, "span_us": round(self.span_us, 3),
                "replayed_us": round(self.replayed_us, 3),
                "predicted_us": round(self.predicted_us, 3),
                "change": round(self.predicted_us / self.replayed_us - 1, 4)
                if self.replayed_us else 0.0,
                "critical_path_before_us": {k: round(v, 3) for k, v in self.before_us.items()},
                "critical_path_after_us": {k: round(v, 3) for k, v in self.after_us.items()}}


@dataclass
class RunWhatIf:
    """The ranks replayed together: per rank as ``RankWhatIf`` (its span from its own start),
    and the run from its first start to its last end."""

    ranks: list[RankWhatIf]
    span_us: float
    replayed_us: float
    predicted_us: float
    matched: int  # collectives and send / receive pairs matched across ranks
    unknown: int  # communication nodes whose wait for peers is not known
    notes: list[str]
    before: Schedule | None = None
    after: Schedule | None = None
    origin_us: float = 0.0  # the run's first start, on the corrected clocks: the schedules' 0

    def to_json(self) -> dict:
        return {"ranks": len(self.ranks), "span_us": round(self.span_us, 3),
                "replayed_us": round(self.replayed_us, 3),
                "predicted_us": round(self.predicted_us, 3),
                "change": round(self.predicted_us / self.replayed_us - 1, 4)
                if self.replayed_us else 0.0,
                "matched_collectives": self.matched, "wait_unknown": self.unknown}


# whatif's kind of each of run_model's: host ops, kernels and memory are all compute; a NCCL
# kernel whose launch is not in the trace is communication all the same (--comm scales it).
KIND_OF = ("compute", "compute", "comm", "compute", "gap")


def collectives_in_order(c: Columns) -> list[int]:
    """The positions of one rank's communication nodes in the order they started (then by id)."""
    starts, types, ids = c.starts, c.types, c.ids
    timed = [p for p in range(len(c)) if types[p] in _COMM and starts[p] == starts[p]]
    return sorted(timed, key=lambda p: (starts[p], ids[p]))


def carried_in_order(r: Rank) -> list[int]:
    """The communication nodes whose times ``--comm-from`` carries between two conversions of
    one program, in start order: all but barriers, which move no data (their time is waiting)
    and which --target astra-sim replays as compute; they keep this run's time."""
    ids, comm = r.columns.ids, r.comm

    def barrier(attrs) -> bool:
        return ("comm_type" in attrs
                and run_peers.attr_value(attrs, "comm_type") == COMM_TYPES["barrier"])

    return [p for p in collectives_in_order(r.columns) if not barrier(comm.get(ids[p], {}))]


def durations(r: Rank, change: Change = Change(),
              measured_elsewhere: Sequence[float] | None = None) -> tuple[array, array]:
    """By position, (the measured durations, the changed ones), us. ``measured_elsewhere``:
    each collective in start order takes those durations (ValueError when the counts
    differ)."""
    c = r.columns
    measured = c.durs
    changed = array("d", measured)
    if change.compute != 1.0 or change.comm != 1.0 or change.comm_by_type:  # (x 1.0: nothing)
        kinds, ids = c.kinds, c.ids
        for p in range(len(changed)):
            kind = KIND_OF[kinds[p]]
            if kind == "compute":
                changed[p] *= change.compute
            elif kind == "comm":
                changed[p] *= comm_factor(change, r.comm.get(ids[p], {}))
    if measured_elsewhere is not None:
        ordered = carried_in_order(r)
        if len(ordered) != len(measured_elsewhere):
            raise ValueError(f"{r.path}: {len(ordered)} collectives, but the other run has "
                             f"{len(measured_elsewhere)} for this rank: not the same program")
        for p, dur in zip(ordered, measured_elsewhere):
            changed[p] = dur
    return measured, changed


def comm_factor(change: Change, attrs: Mapping[str, object]) -> float:
    """The factor ``change`` puts on a communication node with these attributes."""
    by_type = change.comm_by_type or {}
    if "comm_type" in attrs and int(run_peers.attr_value(attrs, "comm_type")) in by_type:
        return by_type[int(run_peers.attr_value(attrs, "comm_type"))]
    return change.comm


def as_rank(path: str, nodes: Sequence[Node] | Rank) -> Rank:
    """A rank of decoded nodes (the one-rank tools' input) in the run model."""
    return nodes if isinstance(nodes, Rank) else Rank.of_nodes(-1, path, nodes, keep=False)


def replay(path: str, nodes: Sequence[Node] | Rank, change: Change = Change(),
           measured_elsewhere: Sequence[float] | None = None) -> RankWhatIf:
    """One rank's replay before and after ``change`` (and, with ``measured_elsewhere``, each
    collective in start order taking those durations, us)."""
    r = as_rank(path, nodes)
    span = span_of(r.columns)
    measured, changed = durations(r, change, measured_elsewhere)
    before = _path(r.columns, measured)
    after = _path(r.columns, changed)
    return RankWhatIf(path, span, before[0], after[0], before[1], after[1])


def _path(c: Columns, dur: array) -> tuple[float, dict[str, float]]:
    finish, via, at = longest_path(c, dur)
    if at < 0:
        return 0.0, dict.fromkeys(KINDS, 0.0)
    made_of = dict.fromkeys(KINDS, 0.0)
    length = finish[at]
    kinds = c.kinds
    while at >= 0:
        made_of[KIND_OF[kinds[at]]] += dur[at]
        at = via[at]
    return length, made_of


_STRIDE = 1 << 40  # a node's place in the run's order: rank index * _STRIDE + node id


@dataclass
class Schedule:
    """A replay of the run, over its nodes numbered rank after rank (``first[i]`` + a node's
    position in rank i's columns): each node's finish (us from the run's first start; nan for a
    node never run), the node that decided its start (-1: none), its duration as replayed (a
    matched collective: its wait for peers and its transfer), its wait (matched collectives),
    and the order in which the nodes finished."""

    finish: array
    via: array
    took: array
    waited: dict[int, float]
    sequence: array
    first: list[int]
    rank_of: array  # by node number, its rank's index
    notes: list[str]
    base: list[float] = field(default_factory=list)  # by rank index: its first start

    def rank_ends(self, ranks: int) -> list[float]:
        """Each rank's last finish (by rank index), in one pass."""
        ends = [0.0] * ranks
        finish, first = self.finish, self.first
        for i in range(ranks):
            end = ends[i]
            for g in range(first[i], first[i + 1]):
                t = finish[g]
                if t > end:
                    end = t
            ends[i] = end
        return ends

    def per_rank(self, ranks: Sequence[Rank], only: Sequence[int] | None = None
                 ) -> list[dict[int, tuple[float, float, float]]]:
        """By rank index, node id -> (finish, duration, wait), in the order they finished; of
        the rank indices in ``only`` (the others empty), or of all."""
        out: list[dict[int, tuple[float, float, float]]] = [{} for _ in ranks]
        ids = [r.columns.ids for r in ranks]
        wanted = bytearray([only is None]) * len(ranks)
        for i in only or ():
            wanted[i] = 1
        rank_of = self.rank_of
        finish, took, waited, first = self.finish, self.took, self.waited, self.first
        for g in self.sequence:
            i = rank_of[g]
            if wanted[i]:
                out[i][ids[i][g - first[i]]] = (finish[g], took[g], waited.get(g, 0.0))
        return out

    def ends_by(self, ranks: int) -> list[int]:
        """Per rank index, the node that finished it (the first to reach its last finish), or
        -1: one pass over the order the nodes finished in."""
        best, by = [float("-inf")] * ranks, [-1] * ranks
        rank_of = self.rank_of
        finish = self.finish
        for g in self.sequence:
            i = rank_of[g]
            if finish[g] > best[i]:
                best[i], by[i] = finish[g], g
        return by


def _firsts(ranks: Sequence[Rank]) -> list[int]:
    first = [0]
    for r in ranks:
        first.append(first[-1] + len(r.columns))
    return first


def _rank_of(first: Sequence[int]) -> array:
    """By the run's node number, the index of its rank."""
    out = array("i")
    for i in range(len(first) - 1):
        out.extend(array("i", [i]) * (first[i + 1] - first[i]))
    return out


def replay_run(ranks: Sequence[Rank], change: Change = Change(),
               only: set[int] | None = None, peers: run_peers.Peers | None = None,
               comm_from: Mapping[int, Sequence[float]] | None = None,
               per_rank: Mapping[int, Change] | None = None,
               comm_factors: Mapping[run_peers.Key, float] | None = None) -> RunWhatIf:
    """The ranks of one run replayed together before and after ``change`` (module
    docstring), the change applied to the ranks in ``only`` (all when None), or each rank's
    own from ``per_rank``. ``comm_from``: per rank, the other run's communication times in
    start order (``run_comm_times``). ``comm_factors``: per communication node (rank, id), a
    factor on its transfer (its whole time where it was not matched) on top of the rest: a
    network change (converter/network_change.py)."""
    peers = peers or run_peers.analyse(ranks)
    origin, base = _starts(ranks, peers)
    first = _firsts(ranks)
    measured, changed = array("d"), array("d")
    transfer, changed_transfer = {}, {}
    for index, r in enumerate(ranks):
        change_here = Change() if only is not None and r.rank not in only else change
        if per_rank is not None:
            change_here = per_rank.get(r.rank, Change())
        mine, theirs = durations(r, change_here)
        elsewhere = comm_from.get(r.rank) if comm_from is not None else None
        if comm_from is not None and elsewhere is None:
            raise ValueError(f"{r.path}: the other run has no ET of rank {r.rank}")
        if elsewhere is not None:
            ordered = carried_in_order(r)
            if len(ordered) != len(elsewhere):
                raise ValueError(f"{r.path}: {len(ordered)} collectives, but the other run has "
                                 f"{len(elsewhere)} for this rank: not the same program")
        measured.extend(mine)
        changed.extend(theirs)
        at = first[index]
        for nid in r.comm:
            took = peers.transfer_us.get((r.rank, nid))
            if took is not None:
                p = r.position(nid)
                key, dur = at + p, mine[p]
                transfer[key] = took
                changed_transfer[key] = took * (theirs[p] / dur if dur else 1.0)
        if elsewhere is not None:  # the other run's times, and --comm on top of them
            ids = r.columns.ids
            for p, took in zip(ordered, elsewhere):
                key = at + p
                took *= comm_factor(change_here, r.comm.get(ids[p], {}))
                if key in transfer:
                    changed_transfer[key] = took
                else:
                    changed[key] = took
        for nid in r.comm if comm_factors else ():
            factor = comm_factors.get((r.rank, nid))
            if factor is not None:
                key = at + r.position(nid)
                if key in transfer:
                    changed_transfer[key] *= factor
                else:
                    changed[key] *= factor
    before = _schedule(ranks, peers, base, measured, transfer)
    after = _schedule(ranks, peers, base, changed, changed_transfer)
    ends_before, ends_after = before.rank_ends(len(ranks)), after.rank_ends(len(ranks))
    made_before = _made_of(ranks, before, measured)
    made_after = _made_of(ranks, after, changed)
    out = [RankWhatIf(r.path, span_of(r.columns), ends_before[index] - base[index],
                      ends_after[index] - base[index], made_before[index], made_after[index],
                      r.rank)
           for index, r in enumerate(ranks)]
    ends = [_last_end(r.columns) - peers.offsets_us.get(r.rank, 0.0) for r in ranks]
    return RunWhatIf(out, max(ends, default=0.0) - origin, max(ends_before, default=0.0),
                     max(ends_after, default=0.0), len(peers.columns), len(peers.unknown),
                     peers.notes + before.notes + after.notes, before, after, origin)


def _last_end(c: Columns) -> float:
    starts, durs = c.starts, c.durs
    return max((starts[p] + durs[p] for p in range(len(starts)) if starts[p] == starts[p]),
               default=0.0)


def _starts(ranks: Sequence[Rank], peers: run_peers.Peers) -> tuple[float, list[float]]:
    """The run's first start on the corrected clocks, and each rank's first start from it (the
    schedules' 0 and each rank's base)."""
    starts = [r.start() - peers.offsets_us.get(r.rank, 0.0) for r in ranks]
    origin = min(starts, default=0.0)
    return origin, [start - origin for start in starts]


def replay_schedule(ranks: Sequence[Rank], peers: run_peers.Peers,
                    transfers_us: Mapping[run_peers.Key, float] | None = None) -> Schedule:
    """The run replayed as ``replay_run`` replays it, with the recorded durations, except that
    a communication node in ``transfers_us`` (rank, id) takes that transfer (its whole time
    where it was not matched). Such transfers hold no queueing, as recorded ones do: a rank's
    matched ones run one at a time, in the order the rank started them (as a communicator's
    stream or gloo's queue runs them, and ASTRA-sim, one chunk per dimension at a time).
    ``base`` set."""
    base, first, dur, transfer = _recorded_inputs(ranks, peers)
    given = transfers_us or {}
    queue_after: dict[int, int] = {}
    for index, r in enumerate(ranks) if given else ():
        at = first[index]
        previous = -1
        for p in collectives_in_order(r.columns):
            nid = r.columns.ids[p]
            if (r.rank, nid) in given and (r.rank, nid) in peers.transfer_us:
                if previous >= 0:
                    queue_after[at + p] = previous
                previous = at + p
        for nid in r.comm:
            took = given.get((r.rank, nid))
            if took is not None:
                key = at + r.position(nid)
                if key in transfer:
                    transfer[key] = took
                else:
                    dur[key] = took
    schedule = _schedule(ranks, peers, base, dur, transfer, queue_after)
    schedule.base = base
    return schedule


def _recorded_inputs(ranks: Sequence[Rank], peers: run_peers.Peers
                     ) -> tuple[list[float], list[int], array, dict[int, float]]:
    """What ``_schedule`` replays the run as recorded with: each rank's first start, where
    each rank's nodes begin in the run's numbering, every node's duration and each matched
    collective's transfer (by that numbering)."""
    _, base = _starts(ranks, peers)
    first = _firsts(ranks)
    dur, transfer = array("d"), {}
    for index, r in enumerate(ranks):
        dur.extend(r.columns.durs)
        for nid in r.comm:
            if (r.rank, nid) in peers.transfer_us:
                transfer[first[index] + r.position(nid)] = peers.transfer_us[(r.rank, nid)]
    return base, first, dur, transfer


STRAGGLER_TRY_ALL_UP_TO = 16  # ranks: every rank is tried as the straggler; in a bigger run,
STRAGGLER_CANDIDATES = 3  # the ranks most waited for (each try is a replay of the run)


@dataclass
class Straggler:
    """Who holds the run up. Per rank, the time its peers spent waiting for it (each
    collective's waits are its last member's doing); per rank tried (every rank of a run of up
    to ``STRAGGLER_TRY_ALL_UP_TO``, else the ``STRAGGLER_CANDIDATES`` most waited for), how much
    shorter the run replays with its compute brought to the others' median (none where it
    computed no more than they did); the straggler is the rank that shortens it most. And the
    run replayed with every rank's compute at the median rank's (ByteDance's S = measured /
    that)."""

    waited_for_us: dict[int, float]
    compute_us: dict[int, float]
    replayed_us: float
    at_median_us: float
    shortened_us: dict[int, float] = field(default_factory=dict)

    @property
    def rank(self) -> int | None:
        best = max(self.shortened_us.items(), key=lambda kv: (kv[1], -kv[0]), default=None)
        return best[0] if best and best[1] > 0 else None

    @property
    def most_waited_for(self) -> int | None:
        return most_waited_for(self.waited_for_us)

    def others_median_us(self, rank: int) -> float:
        others = sorted(c for r, c in self.compute_us.items() if r != rank)
        return others[(len(others) - 1) // 2] if others else 0.0

    @property
    def slowdown(self) -> float:
        return self.replayed_us / self.at_median_us if self.at_median_us else 1.0

    def to_json(self) -> dict:
        return {"rank": self.rank, "most_waited_for": self.most_waited_for,
                "shortened_us": {str(k): round(v, 3) for k, v in self.shortened_us.items()},
                "waited_for_us": {str(k): round(v, 3) for k, v in self.waited_for_us.items()},
                "compute_us": {str(k): round(v, 3) for k, v in self.compute_us.items()},
                "replayed_us": round(self.replayed_us, 3),
                "at_median_compute_us": round(self.at_median_us, 3),
                "slowdown": round(self.slowdown, 4)}


def compute_us(rank: Rank) -> float:
    """A rank's compute: its compute nodes' durations (not gaps, not communication) added up."""
    c = rank.columns
    kinds, durs = c.kinds, c.durs
    return sum(durs[p] for p in range(len(kinds)) if KIND_OF[kinds[p]] == "compute")


def waited_for(ranks: Sequence[Rank], peers: run_peers.Peers) -> dict[int, float]:
    """Per rank, how long its peers waited for it in all (each matched collective's waits are
    its last member's doing)."""
    waited = {r.rank: 0.0 for r in ranks}
    for column in peers.columns:
        last = peers.last_arrival(column)
        waited[last[0]] += sum(peers.wait_us[k] for k in column if k != last)
    return waited


def most_waited_for(waited: Mapping[int, float]) -> int | None:
    """The rank its peers waited for longest (``waited_for``; the lower on a tie), or None
    where none was waited for."""
    worst = max(waited.items(), key=lambda kv: (kv[1], -kv[0]), default=None)
    return worst[0] if worst and worst[1] > 0 else None


def straggler(ranks: Sequence[Rank], peers: run_peers.Peers) -> Straggler:
    """``Straggler`` for a run (compute: a rank's compute nodes other than gaps, added up)."""
    waited = waited_for(ranks, peers)
    compute = {r.rank: compute_us(r) for r in ranks}
    middle = sorted(compute.values())[(len(compute) - 1) // 2] if compute else 0.0
    scaled = {rank: Change(compute=middle / c) for rank, c in compute.items() if c}
    run = replay_run(ranks, peers=peers, per_rank=scaled)
    late = Straggler(waited, compute, run.replayed_us, run.predicted_us)
    if len(ranks) <= STRAGGLER_TRY_ALL_UP_TO:
        tried = sorted(compute)
    else:
        tried = [k for k in sorted(waited, key=lambda k: (-waited[k], k)) if waited[k] > 0]
        tried = tried[:STRAGGLER_CANDIDATES]
    index_of = {r.rank: i for i, r in enumerate(ranks)}
    recorded = None  # the replay's inputs, made for the first rank that needs one
    for rank in tried:
        target = late.others_median_us(rank)
        if not compute[rank] or compute[rank] <= target:
            late.shortened_us[rank] = 0.0
            continue
        if recorded is None:
            recorded = _recorded_inputs(ranks, peers)
        base, first, measured, transfer = recorded
        i = index_of[rank]
        changed = array("d", measured)
        changed[first[i]:first[i + 1]] = durations(ranks[i], Change(compute=target / compute[rank]))[1]
        ends = _schedule(ranks, peers, base, changed, transfer).rank_ends(len(ranks))
        late.shortened_us[rank] = run.replayed_us - max(ends, default=0.0)
    return late


COMPUTE_CARRIED = 0.10  # --comm-from: compute that differs more than this is said


def comm_from_problems(ranks: Sequence[run_peers.Rank], groups: Mapping[str, Sequence[int]],
                       world: int, theirs: Sequence[run_peers.Rank],
                       their_groups: Mapping[str, Sequence[int]], their_world: int,
                       source: str) -> list[str]:
    """What ``comm_from`` cannot carry: another world size or other process groups
    (ValueError: transfers measured on another cluster are not this run's), and compute that
    differs between the two runs by more than ``COMPUTE_CARRIED`` (a note with the figures:
    the prediction keeps this run's compute, so it predicts the other run only where the two
    computed alike)."""
    if world != their_world:
        raise ValueError(f"--comm-from {source}: a run of {their_world} rank(s), this one has "
                         f"{world}: its transfers were measured on another cluster (for a "
                         "network change, --bandwidth, --latency or --network)")
    everyone = list(range(world))  # a group of every rank is the run's, written or not (a
    # --target astra-sim conversion leaves them out: ASTRA-sim reserves them)
    mine = {k: sorted(v) for k, v in groups.items() if sorted(v) != everyone}
    other = {k: sorted(v) for k, v in their_groups.items() if sorted(v) != everyone}
    if mine != other:
        differ = sorted(set(mine) ^ set(other)) or sorted(k for k in mine if mine[k] != other[k])
        raise ValueError(f"--comm-from {source}: its process groups (comm_group.json) differ "
                         f"from this run's (group {differ[0]!r}): not the same program")
    here = {r.rank: compute_us(r) for r in ranks}
    there = {r.rank: compute_us(r) for r in theirs}
    total_here = sum(here.values())
    total_there = sum(there[k] for k in here if k in there)
    if not total_here or not total_there or abs(total_there / total_here - 1) <= COMPUTE_CARRIED:
        return []
    worst = max((k for k in here if k in there and here[k]),
                key=lambda k: abs(there[k] / here[k] - 1))
    return [f"--comm-from {source}: the two runs' compute differs ({total_here / 1e3:,.3f} ms "
            f"here, {total_there / 1e3:,.3f} ms there, {total_there / total_here - 1:+.1%}; "
            f"rank {worst} {here[worst] / 1e3:,.3f} against {there[worst] / 1e3:,.3f} ms): "
            f"the prediction keeps this run's compute and takes only the other's transfers, "
            f"so it predicts that run no better than that"]


def run_comm_times(ranks: Sequence[Rank], peers: run_peers.Peers | None = None
                   ) -> dict[int, list[float]]:
    """Per rank, its communication nodes' times in start order, as another run's
    ``replay_run`` takes them: the transfer where the collective was matched, else the whole
    recorded time."""
    peers = peers or run_peers.analyse(ranks)
    out = {}
    for r in ranks:
        ids, durs = r.columns.ids, r.columns.durs
        out[r.rank] = [peers.transfer_us.get((r.rank, ids[p]), durs[p])
                       for p in carried_in_order(r)]
    return out


def _schedule(ranks: Sequence[Rank], peers: run_peers.Peers, base: list[float],
              dur: array, transfer: dict[int, float],
              queue_after: Mapping[int, int] | None = None) -> Schedule:
    """The run's replay (``Schedule``) with durations ``dur`` and matched collectives'
    ``transfer``s (both by the run's node numbers). Kahn's algorithm over every rank's
    dependencies; a matched collective's members are held until the last of them is ready,
    then each ends its own transfer after that moment. ``queue_after``: a matched collective ->
    the one before it on its rank whose transfer it queues behind (transfers that were not
    recorded, so hold no queueing of their own); its transfer starts once the last member is
    ready and every member's queue is free. Where ranks' orders contradict each other (no
    schedule lets every member arrive), the collectives still held are released one by one as
    one-rank nodes, and that is noted."""
    first = _firsts(ranks)
    total = first[-1]
    rank_of = _rank_of(first)
    index_of = {r.rank: i for i, r in enumerate(ranks)}
    column_of: dict[int, int] = {}
    for c, column in enumerate(peers.columns):
        for rank, nid in column:
            i = index_of[rank]
            column_of[first[i] + ranks[i].position(nid)] = c
    columns = [r.columns for r in ranks]
    users = [c.users() for c in columns]
    waiting = array("q")
    for c in columns:
        dep_at = c.dep_at
        waiting.extend(array("q", (dep_at[p + 1] - dep_at[p] for p in range(len(c)))))
    finish = array("d", [float("nan")]) * total
    via = array("q", [-1]) * total
    took = array("d", bytes(8 * total))
    sequence = array("q")
    waited: dict[int, float] = {}
    arrived: dict[int, dict[int, float]] = defaultdict(dict)  # column -> member -> ready time
    released: set[int] = set()
    notes: list[str] = []
    queue_after = queue_after or {}
    queued_behind: dict[int, int] = {}  # a collective -> the one queued after it
    for key, before in queue_after.items():
        waiting[key] += 1
        queued_behind[before] = key
    ready = [g for g in range(total) if waiting[g] == 0]

    def ready_time(key: int) -> float:
        i = rank_of[key]
        at = first[i]
        c = columns[i]
        p = key - at
        deps = c.deps
        best, by = base[i], -1
        for k in range(c.dep_at[p], c.dep_at[p + 1]):
            d = deps[k] + at
            fd = finish[d]
            if fd > best or by < 0 and fd == best:
                best, by = fd, d
        if by >= 0:
            via[key] = by
        return best

    def done(key: int, t: float) -> None:
        finish[key] = t
        sequence.append(key)
        i = rank_of[key]
        at = first[i]
        user_at, rank_users = users[i]
        p = key - at
        for k in range(user_at[p], user_at[p + 1]):
            user = rank_users[k] + at
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
        behind = queued_behind.get(key)
        if behind is not None:
            waiting[behind] -= 1
            if waiting[behind] == 0:
                ready.append(behind)

    def order_key(key: int) -> int:  # the run's order of node ids, as ranks' orders tie-break
        i = rank_of[key]
        return i * _STRIDE + columns[i].ids[key - first[i]]

    while True:
        while ready:
            key = ready.pop()
            t = ready_time(key)
            column = column_of.get(key)
            if column is None or column in released:
                took[key] = dur[key]
                done(key, t + took[key])
                continue
            members = arrived[column]
            members[key] = t
            if len(members) < len(peers.columns[column]):
                continue
            last_key = max(members, key=lambda k: (members[k], -order_key(k)))
            last = members[last_key]
            start, queue = last, -1  # the transfer's start, and the collective that held it
            for member in members if queue_after else ():
                before = queue_after.get(member, -1)
                if before >= 0 and finish[before] > start:
                    start, queue = finish[before], before
            for member, when in members.items():
                if queue >= 0:  # it queued: the path goes to the transfer before it
                    via[member] = queue
                elif member != last_key and last > when:  # it waited: the path goes to the last
                    via[member] = via[last_key]
                took[member] = start - when + transfer.get(member, 0.0)
                waited[member] = last - when
                done(member, start + transfer.get(member, 0.0))
        held = [c for c, members in arrived.items() if c not in released
                and len(members) < len(peers.columns[c])]
        if not held:
            break
        # Ranks' orders disagree: let the earliest held collective's members go alone.
        c = min(held, key=lambda c: min(arrived[c].values()))
        released.add(c)
        notes.append(f"replay: collective {peers.columns[c]} could not gather its members "
                     "(the ranks' orders disagree); replayed per rank")
        for member, when in arrived[c].items():
            took[member] = dur[member]
            done(member, when + took[member])
    return Schedule(finish, via, took, waited, sequence, first, rank_of, notes)


def _made_of(ranks: Sequence[Rank], schedule: Schedule, dur: array) -> list[dict[str, float]]:
    """Per rank index, the critical path that ends it by kind; ``peer``: time on other
    ranks."""
    finish, via, took, first = schedule.finish, schedule.via, schedule.took, schedule.first
    rank_of = schedule.rank_of
    out = []
    for index, at in enumerate(schedule.ends_by(len(ranks))):
        made_of = dict.fromkeys(RUN_KINDS, 0.0)
        while at >= 0:
            before = via[at]
            part = finish[at] - finish[before] if before >= 0 else took[at]
            i = rank_of[at]
            kind = "peer" if i != index else KIND_OF[ranks[i].columns.kinds[at - first[i]]]
            made_of[kind] += max(part, 0.0)
            at = before
        out.append(made_of)
    return out


def collective_durations(nodes: Sequence[Node]) -> list[float]:
    """Measured durations (us) of one ET's collectives in start order (for ``comm_from``)."""
    r = as_rank("", nodes)
    return [r.columns.durs[p] for p in carried_in_order(r)]


def parse_factor(text: str) -> float:
    """'0.25', '0.25x' or 'x0.25' -> 0.25 (a multiplier of durations)."""
    value = text.strip().lower().removesuffix("x").removeprefix("x")
    try:
        factor = float(value)
    except ValueError:
        raise ValueError(f"{text!r}: expected a duration factor such as 0.25x") from None
    if factor < 0:
        raise ValueError(f"{text!r}: a duration factor cannot be negative")
    return factor


def parse_change(comm: Sequence[str], compute: str | None) -> Change:
    """``--comm`` values ('0.25x' for all, 'all_reduce=0.5x' per type) and ``--compute``."""
    overall, by_type = 1.0, {}
    for item in comm:
        if "=" in item:
            name, _, value = item.partition("=")
            key = name.strip().lower()
            if key not in COMM_TYPES:
                raise ValueError(f"--comm {item!r}: unknown collective type {name!r}; expected "
                                 f"one of {', '.join(sorted(COMM_TYPES))}")
            by_type[COMM_TYPES[key]] = parse_factor(value)
        else:
            overall = parse_factor(item)
    return Change(overall, parse_factor(compute) if compute else 1.0, by_type or None)


def render_straggler(late: Straggler) -> str:
    waited = late.most_waited_for
    lines = []
    if waited is not None:
        lines.append(f"  most waited for: rank {waited} (the others waited "
                     f"{late.waited_for_us[waited] / 1e3:,.3f} ms for it in all)")
    rank = late.rank
    if rank is None:
        lines.append(f"  straggler: none ({len(late.shortened_us)} rank(s) tried: none that "
                     "computed more than the others' median shortens the run brought to it)")
    else:
        lines.append(f"  straggler: rank {rank} (its compute "
                     f"{late.compute_us[rank] / 1e3:,.3f} ms against the others' median "
                     f"{late.others_median_us(rank) / 1e3:,.3f}); brought to theirs, the run "
                     f"replays in {(late.replayed_us - late.shortened_us[rank]) / 1e3:,.3f} ms "
                     f"instead of {late.replayed_us / 1e3:,.3f} "
                     f"({-late.shortened_us[rank] / late.replayed_us:+.1%})")
    lines.append(f"  with every rank's compute at the median rank's, the run replays in "
                 f"{late.at_median_us / 1e3:,.3f} ms (slowdown S = {late.slowdown:.3f})")
    return "\n".join(lines)


def render_run(run: RunWhatIf, change: str) -> str:
    """The ranks replayed together (``replay_run``): per rank, then the run."""
    lines = [f"what if: {change}"]
    lines += _rank_lines(run.ranks)
    delta = run.predicted_us / run.replayed_us - 1 if run.replayed_us else 0.0
    lines.append(f"run of {len(run.ranks)} rank(s): {_measured(run.span_us, run.replayed_us)}, "
                 f"predicted {run.predicted_us / 1e3:,.3f} ms ({delta:+.1%} against the replay)")
    lines.append(f"  {run.matched:,} collective(s) and send / receive pair(s) matched across "
                 f"ranks (each counted once for all its members; convert and stats count each "
                 f"rank's nodes): their transfers start when the last member arrives"
                 + (f"; {run.unknown:,} communication node(s) whose peers were not all recorded "
                    f"keep their recorded time, waits included" if run.unknown else ""))
    lines += [f"  note: {note}" for note in run.notes]
    return "\n".join(lines)


def _measured(span_us: float, replayed_us: float) -> str:
    """The measured span and the replay of the unchanged ET, which a prediction is against."""
    if not span_us:
        return (f"no recorded times (an ET without them, as the reference converter writes), "
                f"replayed {replayed_us / 1e3:,.3f} ms")
    said = f"measured {span_us / 1e3:,.3f} ms, replayed {replayed_us / 1e3:,.3f} ms"
    if replayed_us < span_us * 0.995:
        return (f"{said} ({replayed_us / span_us:.1%} of it: the rest is time no dependency or "
                "gap holds)")
    if replayed_us > span_us * 1.005:  # ranks replayed together wait for each other
        return (f"{said} ({replayed_us / span_us:.1%} of it: the replay holds collectives until "
                "their last member arrives, where the recording let some go sooner)")
    return said


def _rank_lines(ranks: Sequence[RankWhatIf]) -> list[str]:
    lines = []
    for r in ranks:
        delta = r.predicted_us / r.replayed_us - 1 if r.replayed_us else 0.0
        b, a = r.before_us, r.after_us
        lines.append(f"{r.path}: {_measured(r.span_us, r.replayed_us)}, predicted "
                     f"{r.predicted_us / 1e3:,.3f} ms ({delta:+.1%} against the replay)")
        lines.append("  critical path, before -> after (ms): " + ", ".join(
            f"{'other ranks' if k == 'peer' else k} {b[k] / 1e3:,.3f} -> {a[k] / 1e3:,.3f}"
            for k in RUN_KINDS))
    return lines
