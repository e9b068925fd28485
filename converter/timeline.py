"""``chakra-hooks timeline``: converted ETs as a Chrome Trace Event file that Perfetto
(ui.perfetto.dev) and chrome://tracing open.

Per rank one process; in it one track per lane (host thread, device stream) holding the nodes
at their recorded start and duration, and beside each lane its gaps on a track of their own
(``<lane> gaps``): the empty time on both tracks is idle time a dependency explains, the gap
track shows the time nothing explains. Nodes outside time (process-group METADATA) sit at the
rank's first moment on a track of their own, so that every node of the ET is drawn. Dependencies between lanes are flow arrows. The
critical path (as ``chakra-hooks stats`` computes it) has its own track, and every node on it
says ``critical: true``; the process is labelled with the path's total.

ETs without times (the reference converter's) are laid out by their replay: each node starts
when its dependencies end; nodes a replay never reaches (on or behind a dependency cycle, as in
the reference converter's corpus ET) are drawn one after another after the end, on a track of
their own. With a change (``--comm 0.25x``, ``--compute``, ``--comm-from``,
as ``chakra-hooks whatif``), every rank also gets a second process holding the predicted
schedule (the replay with the changed durations), so the two can be compared lane by lane.

Tracks are split where nodes of one lane overlap without nesting (a lane's ops are sequential
in the recording, but a replay may overlap them): Perfetto refuses slices that cross.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from chakra_hooks.linker.enrich.gaps import GAP_NAME
from chakra_hooks.linker.model import CLOCK_TOLERANCE_PS, PS_PER_US

from .schema import Node, NodeType
from .stats import critical_path
from .whatif import Change

_BYTES_ATTRS = ("comm_size", "tensor_size")
_ARGS = ("comm_type", "pg_name", "comm_src", "comm_dst", "is_cpu_op", "lane", "collective",
         "duration_unknown", "gap_ns", "engine_step", "moe_layer", "kv_direction")
_TYPE_NAMES = {value: NodeType.Name(value) for value in NodeType.values()}
_METADATA = NodeType.Value("METADATA_NODE")
CRITICAL_TRACK = "critical path"
UNTIMED_TRACK = "untimed (metadata)"
STUCK_TRACK = "never runs (on or behind a dependency cycle)"
PREDICTED_PID_BASE = 1_000_000  # what-if processes: their rank + this, sorted after the ranks


@dataclass
class Slice:
    node: Node
    start: int  # ps on the rank's own clock (integers: epoch times in float us lose 0.25 us)
    dur: int  # ps, as drawn (see _trim)
    lane: str
    recorded_dur: int | None = None  # ps, where the drawn duration was trimmed


@dataclass
class RankTimeline:
    """One rank's schedule: slices by node id, and its critical path."""

    rank: int
    path: str
    slices: dict[int, Slice]
    critical: list[int]  # node ids, first to last
    critical_us: float
    by_replay: bool  # laid out by replay (the ET had no times)
    values: dict[int, dict] = field(default_factory=dict)  # node_values
    stuck: int = 0  # nodes on or behind a dependency cycle (replay only), drawn after the end
    # The part of matched collectives spent waiting for a peer (converter/peers.py), drawn on
    # a track of its own beside the collective's lane ("<lane> peer wait").
    waits: list[Slice] = field(default_factory=list)


def schedule(rank: int, path: str, nodes: Sequence[Node],
             values: dict[int, dict] | None = None) -> RankTimeline:
    """Recorded times (or, when the ET has none, the replay of the measured durations, from
    the rank's first recorded moment) and the critical path under those durations.
    ``values``: :func:`node_values` of the nodes, if at hand."""
    values = values if values is not None else node_values(nodes)
    exact = {n.id: _exact_times(n, values[n.id]) for n in nodes}
    dur = {}  # as converter.stats.node_times reads them, so the totals agree
    for node in nodes:
        start, length = exact[node.id]
        v = values[node.id]
        if start is not None:
            dur[node.id] = (v["duration_ns"] * 1e-3 if "start_ns" in v and "duration_ns" in v
                            else length / PS_PER_US)
        else:
            dur[node.id] = 0.0 if "duration_unknown" in v else float(node.duration_micros)
    offset = min((t for t, _ in exact.values() if t is not None), default=0)
    finish, via = critical_path(nodes, dur)
    by_replay = not any(t is not None for t, _ in exact.values())
    slices = {}
    stuck_at = offset + round(max(finish.values(), default=0.0) * PS_PER_US)
    stuck = 0
    for node in nodes:
        start, length = exact[node.id]
        if by_replay:
            length = round(dur.get(node.id, 0.0) * PS_PER_US)
            if node.id not in finish:  # on or behind a dependency cycle: a replay never runs it
                slices[node.id] = Slice(node, stuck_at, length, STUCK_TRACK)
                stuck_at += length
                stuck += 1
                continue
            start = offset + round(finish[node.id] * PS_PER_US) - length
        elif start is None:  # outside time (process groups): at the window's start, apart
            slices[node.id] = Slice(node, offset, 0, UNTIMED_TRACK)
            continue
        slices[node.id] = Slice(node, start, length, _lane(values[node.id]))
    critical: list[int] = []
    at = max(finish, key=finish.get) if finish else None
    total = finish[at] if at is not None else 0.0
    while at is not None:
        critical.append(at)
        at = via.get(at)
    critical.reverse()
    return RankTimeline(rank, path, slices, critical, total, by_replay, values, stuck)


def add_waits(tl: RankTimeline, waits: dict[int, float]) -> None:
    """The peer wait (node id -> us) at the start of each collective's slice, apart."""
    for nid, wait in waits.items():
        s = tl.slices.get(nid)
        if s is not None and wait > 0:
            tl.waits.append(Slice(s.node, s.start, min(round(wait * PS_PER_US), s.dur),
                                  f"{s.lane} peer wait"))


def from_run(rank: int, path: str, nodes: Sequence[Node], values: dict[int, dict],
             replayed: dict[int, tuple[float, float, float]], origin_ps: int,
             predicted_us: float) -> RankTimeline:
    """One rank's nodes as the run's replay placed them (``whatif.Schedule.per_rank``: finish,
    duration, wait, us from the run's first start at ``origin_ps``), its critical path the
    rank's longest chain of its own nodes, its collectives' waits apart; ``predicted_us``: the
    rank's span in that replay."""
    slices = {}
    for node in nodes:
        if node.id not in replayed:
            continue
        finish, took, _ = replayed[node.id]
        length = round(took * PS_PER_US)
        # untimed nodes (process groups) on the track the recording draws them on
        lane = UNTIMED_TRACK if node.type == _METADATA else _lane(values[node.id])
        slices[node.id] = Slice(node, origin_ps + round(finish * PS_PER_US) - length, length,
                                lane)
    dur = {nid: took for nid, (_, took, _) in replayed.items()}
    finish, via = critical_path(nodes, dur)
    critical: list[int] = []
    at = max(finish, key=finish.get) if finish else None
    while at is not None:
        critical.append(at)
        at = via.get(at)
    critical.reverse()
    tl = RankTimeline(rank, path, slices, critical, predicted_us, True, values)
    add_waits(tl, {nid: wait for nid, (_, _, wait) in replayed.items()})
    return tl


def node_values(nodes: Sequence[Node]) -> dict[int, dict[str, object]]:
    """Per node id, its attributes' values by name (scalars as they are, lists as lists): one
    pass over each node's attributes, shared by every step here. The loop is
    ``converter.attrs.value_of`` inlined (a call per attribute was a tenth of a large run)."""
    out = {}
    for node in nodes:
        v = {}
        for attr in node.attr:
            which = attr.WhichOneof("value")
            if which is not None:
                value = getattr(attr, which)
                v[attr.name] = list(value.values) if which.endswith("_list") else value
        out[node.id] = v
    return out


def _exact_times(node: Node, v: dict) -> tuple[int | None, int]:
    """(start ps or None, duration ps) from the finest time the node carries."""
    if "start_ps" in v:
        return int(v["start_ps"]), int(v.get("duration_ps", 0))
    if "start_ns" in v:
        return int(v["start_ns"]) * 1000, int(v.get("duration_ns", 0)) * 1000
    if not node.start_time_micros:
        return None, 0
    return (node.start_time_micros * PS_PER_US,
            0 if "duration_unknown" in v else node.duration_micros * PS_PER_US)


def lane_title(lane: str) -> str:
    """A lane as Perfetto users name tracks: ``stream:2:4`` -> ``stream 4 (device 2)``,
    ``thread:59812`` -> ``thread 59812``, ``comm:0`` -> ``collectives (group 0)``; the raw
    lane stays in each slice's ``lane`` argument. Suffixes (`` gaps``, `` peer wait``) kept."""
    for suffix in (" gaps", " peer wait"):
        if lane.endswith(suffix):
            return lane_title(lane[:-len(suffix)]) + suffix
    kind, _, rest = lane.partition(":")
    if kind == "stream" and rest.count(":") == 1:
        device, _, stream = rest.partition(":")
        return f"stream {stream} (device {device})"
    if kind == "thread" and rest:
        return f"thread {rest[2:]} (host ET)" if rest.startswith("et") else f"thread {rest}"
    if kind == "comm" and rest:
        return "collectives (default group)" if rest == "default" else \
            f"collectives (group {rest})"
    if kind == "tpu" and rest.count(":") >= 1:
        ordinal, _, line = rest.partition(":")
        return f"{line} (TPU {ordinal})"
    if kind == "cpu" and rest:
        return f"XLA CPU device {rest}"
    if kind == "engine_step" and rest:
        return f"engine step {rest}"
    if kind == "moe_routing" and rest:
        return f"MoE routing {rest}"
    return lane


def _lane(v: dict) -> str:
    if "lane" in v:
        return str(v["lane"])
    return "host" if v.get("is_cpu_op") else "device"


class _Writer:
    """Chrome Trace Event records: complete slices ("X"), names ("M"), flows ("s" / "f")."""

    def __init__(self, origin: int) -> None:
        self.origin = origin
        self.events: list[dict] = []
        self.tids: dict[tuple[int, str], int] = {}
        self.flow_id = 0

    def process(self, pid: int, name: str, sort: int, labels: str) -> None:
        self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                            "args": {"name": name}})
        self.events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                            "args": {"sort_index": sort}})
        self.events.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                            "args": {"labels": labels}})

    def track(self, pid: int, name: str) -> int:
        key = (pid, name)
        tid = self.tids.get(key)
        if tid is None:
            tid = self.tids[key] = len(self.tids) + 1
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                "args": {"name": name}})
            self.events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                                "args": {"sort_index": tid}})
        return tid

    def us(self, ps: int) -> float:
        """A time in us from the origin, to the nanosecond (ends rounded like starts, so that
        slices that touch still touch)."""
        return (ps - self.origin + 500) // 1000 / 1000

    def slice(self, pid: int, tid: int, s: Slice, args: dict) -> None:
        start_ns = (s.start - self.origin + 500) // 1000
        end_ns = (s.start + s.dur - self.origin + 500) // 1000
        kind = _TYPE_NAMES[s.node.type]
        self.events.append({"ph": "X", "name": s.node.name or kind, "cat": kind,
                            "pid": pid, "tid": tid,
                            "ts": start_ns / 1000, "dur": (end_ns - start_ns) / 1000,
                            "args": args})

    def flow(self, src: tuple[int, int, Slice], dst: tuple[int, int, Slice]) -> None:
        """An arrow from the end of one slice to the start of another (each event lies inside
        the slice it binds to: Perfetto binds a flow to the slice enclosing its time)."""
        self.flow_id += 1
        (spid, stid, s), (dpid, dtid, d) = src, dst
        self.events.append({"ph": "s", "name": "dependency", "cat": "dependency",
                            "id": self.flow_id, "pid": spid, "tid": stid,
                            "ts": max(self.us(s.start + s.dur) - 0.001, self.us(s.start))})
        self.events.append({"ph": "f", "bp": "e", "name": "dependency", "cat": "dependency",
                            "id": self.flow_id, "pid": dpid, "tid": dtid,
                            "ts": self.us(d.start)})


def _args(tl: RankTimeline, s: Slice, critical: set[int]) -> dict:
    v = tl.values[s.node.id]
    out: dict[str, object] = {"id": s.node.id, "type": _TYPE_NAMES[s.node.type]}
    for key in _BYTES_ATTRS:
        if key in v:
            out["bytes"] = int(v[key])
    for key in _ARGS:
        if key in v:
            value = v[key]
            out[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
    if s.recorded_dur is not None:
        out["recorded_dur_us"] = s.recorded_dur / PS_PER_US
    if s.node.id in critical:
        out["critical"] = True
    return out


def _trim(lane: list[Slice]) -> None:
    """Where a lane's op ends up to the clock tolerance (converter: 0.5 us) after the next one
    began, draw it ending where the next begins (its recorded length stays in its args):
    crossing slices would be refused by Perfetto, or moved to a track of their own."""
    ordered = sorted(lane, key=lambda s: (s.start, -s.dur))
    for prev, nxt in zip(ordered, ordered[1:]):
        end = prev.start + prev.dur
        if nxt.start < end <= nxt.start + CLOCK_TOLERANCE_PS and nxt.start + nxt.dur > end:
            prev.recorded_dur = prev.dur
            prev.dur = nxt.start - prev.start


def _place(slices: list[Slice]) -> list[int]:
    """A sub-track per slice of one lane so that slices on a sub-track nest or are disjoint:
    the first sub-track whose open slices the new one fits inside (or after)."""
    order = sorted(range(len(slices)), key=lambda i: (slices[i].start, -slices[i].dur))
    stacks: list[list[float]] = []  # per sub-track, the ends of its open slices
    placed = [0] * len(slices)
    for i in order:
        s = slices[i]
        end = s.start + s.dur
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= s.start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                placed[i] = k
                break
        else:
            stacks.append([end])
            placed[i] = len(stacks) - 1
    return placed


def _draw(w: _Writer, pid: int, tl: RankTimeline, flows: bool) -> dict[int, tuple[int, int, Slice]]:
    """One rank's lanes, gap tracks and critical-path track into process ``pid``."""
    critical = set(tl.critical)
    by_track: dict[str, list[Slice]] = defaultdict(list)
    for s in tl.slices.values():
        by_track[f"{s.lane} gaps" if s.node.name == GAP_NAME else s.lane].append(s)
    where: dict[int, tuple[int, int, Slice]] = {}
    args: dict[int, dict] = {}
    for name in sorted(by_track, key=_track_order):
        group = by_track[name]
        _trim(group)
        title = lane_title(name)
        for s, sub in zip(group, _place(group)):
            tid = w.track(pid, title if sub == 0 else f"{title} ({sub + 1})")
            args[s.node.id] = _args(tl, s, critical)
            w.slice(pid, tid, s, args[s.node.id])
            where[s.node.id] = (pid, tid, s)
    waits: dict[str, list[Slice]] = defaultdict(list)
    for s in tl.waits:
        waits[s.lane].append(s)
    for name, group in waits.items():
        title = lane_title(name)
        for s, sub in zip(group, _place(group)):
            tid = w.track(pid, title if sub == 0 else f"{title} ({sub + 1})")
            w.slice(pid, tid, s, {**_args(tl, s, set()), "peer_wait_us": s.dur / PS_PER_US})
    path = [tl.slices[n] for n in tl.critical if n in tl.slices]
    for s, sub in zip(path, _place(path)):
        tid = w.track(pid, CRITICAL_TRACK if sub == 0 else f"{CRITICAL_TRACK} ({sub + 1})")
        w.slice(pid, tid, s, args[s.node.id])
    if flows:
        for s in tl.slices.values():
            dst = where.get(s.node.id)
            for dep in (*s.node.data_deps, *s.node.ctrl_deps):
                src = where.get(dep)
                if src is not None and src[2].lane != s.lane and dst is not None:
                    w.flow(src, dst)
    return where


def _track_order(name: str) -> tuple[int, str]:
    """Host threads first, then device streams, each lane's gaps after it."""
    base = name.removesuffix(" gaps")
    device = base.startswith(("stream", "device", "TPU", "GPU", "/device")) or base == "device"
    return (1 if device else 0, base + ("~" if name.endswith(" gaps") else ""))


def build(recorded: Sequence[RankTimeline], predicted: Sequence[RankTimeline] = (),
          change: str = "", flows: bool = True) -> dict:
    """The Chrome Trace Event document of ``recorded`` ranks (and the ``predicted`` schedules
    beside them). Times are us from the run's first recorded moment."""
    starts = [s.start for tl in (*recorded, *predicted) for s in tl.slices.values()]
    origin = min(starts, default=0)
    w = _Writer(origin)
    for tl in recorded:
        how = "laid out by replay (no times in the ET)" if tl.by_replay else "as recorded"
        w.process(tl.rank, f"rank {tl.rank}", tl.rank,
                  f"critical path {tl.critical_us:,.3f} us; {how}")
        _draw(w, tl.rank, tl, flows)
    for tl in predicted:
        pid = PREDICTED_PID_BASE + tl.rank
        w.process(pid, f"rank {tl.rank} what-if: {change}", pid,
                  f"predicted span {tl.critical_us:,.3f} us (the ranks replayed together)")
        _draw(w, pid, tl, flows)
    return {"traceEvents": w.events, "displayTimeUnit": "ms",
            "otherData": {"producer": "chakra-hooks timeline", "origin_us": origin / PS_PER_US,
                          "what_if": change or None}}


DRAW_ALL_UP_TO = 16  # ranks: a bigger run draws the ranks that matter (``ranks_that_matter``)


def ranks_that_matter(ranks: Sequence, peers) -> dict[int, str]:
    """rank -> why it is drawn, of a run too big to draw whole: the rank its peers waited for
    longest, the rank of the longest recorded span and the rank of the median span."""
    from .stats import span_of
    from .whatif import most_waited_for, waited_for

    why: dict[int, list[str]] = defaultdict(list)
    late = most_waited_for(waited_for(ranks, peers))
    if late is not None:
        why[late].append("most waited for")
    spans = sorted((span_of(r.columns), r.rank) for r in ranks)
    if spans:
        why[spans[-1][1]].append("longest span")
        why[spans[(len(spans) - 1) // 2][1]].append("median span")
    return {rank: ", ".join(reasons) for rank, reasons in why.items()}


@dataclass
class Drawn:
    """What ``draw_files`` drew: the recorded and predicted timelines of the ranks drawn, and
    of a big run, why each was drawn and how many were left out."""

    recorded: list[RankTimeline]
    predicted: list[RankTimeline]
    why: dict[int, str] = field(default_factory=dict)
    left_out: int = 0
    # Per rank drawn, with a change: (measured span, the replay as recorded, the prediction),
    # us: whatif's figures, so that a prediction is against the same replay in both.
    replays: dict[int, tuple[float, float, float]] = field(default_factory=dict)


def draw_files(paths: Sequence[Path], change: Change | None = None, described: str = "",
               flows: bool = True, only: set[int] | None = None,
               comm_from: Sequence[Path] | None = None, show: set[int] | None = None,
               every_rank: bool = False, warn: Callable[[str], None] | None = None
               ) -> tuple[bytes, Drawn]:
    """The Chrome Trace Event JSON of the ETs of one run, each collective's wait for its peers
    apart, with the schedule predicted under ``change`` (on the ranks in ``only``; with
    ``comm_from``, the ETs of another run whose transfers the collectives take) when given:
    the ranks replayed together, as ``whatif`` does. A run of more than ``DRAW_ALL_UP_TO``
    ranks draws the ranks that matter and those in ``show``, unless ``every_rank``; every rank
    is replayed either way. ``warn``: what reading the run says of damage it did not refuse."""
    from chakra_hooks.linker.gc_pause import gc_paused

    from . import etio
    from . import peers as run_peers
    from . import run_model
    from . import whatif

    recorded, predicted = [], []
    replays: dict[int, tuple[float, float, float]] = {}
    with gc_paused():  # millions of small objects, none in a reference cycle
        small = len(paths) <= DRAW_ALL_UP_TO or every_rank
        ranks, groups, world = run_model.read_run(list(paths), keep_nodes=small, progress=None,
                                                  workers=None, warn=warn)
        peers = run_peers.analyse(ranks, groups, world)
        for message in peers.warnings if warn is not None else ():
            warn(message)
        why: dict[int, str] = {}
        drawn = list(range(len(ranks)))
        if len(ranks) > DRAW_ALL_UP_TO and not every_rank:
            why = ranks_that_matter(ranks, peers)
            for rank in sorted(show or ()):
                why.setdefault(rank, "asked for")
            drawn = [i for i, r in enumerate(ranks) if r.rank in why]
        nodes = {i: ranks[i].nodes or etio.read_et(ranks[i].path).nodes for i in drawn}
        values = {i: node_values(nodes[i]) for i in drawn}
        for i in drawn:
            r = ranks[i]
            tl = schedule(r.rank, r.path, nodes[i], values=values[i])
            add_waits(tl, {nid: t for (rank, nid), t in peers.wait_us.items() if rank == r.rank})
            recorded.append(tl)
        if change is not None:
            elsewhere = None
            if comm_from is not None:
                theirs = run_model.read_run(list(comm_from))
                elsewhere = whatif.run_comm_times(theirs[0], run_peers.analyse(*theirs))
            run = whatif.replay_run(ranks, change, only, peers, elsewhere)
            replayed = run.after.per_rank(ranks, drawn)
            for i in drawn:
                r = ranks[i]
                predicted.append(from_run(r.rank, r.path, nodes[i], values[i], replayed[i],
                                          round(run.origin_us * PS_PER_US),
                                          run.ranks[i].predicted_us))
                replays[r.rank] = (run.ranks[i].span_us, run.ranks[i].replayed_us,
                                   run.ranks[i].predicted_us)
        doc = build(recorded, predicted, described if change is not None else "", flows)
        return orjson.dumps(doc), Drawn(recorded, predicted, why, len(ranks) - len(drawn),
                                        replays)
