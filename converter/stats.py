"""``chakra-hooks stats``: how much of the measured time an ET replays, and where it goes.

Per file (rank):
- ``span_us``: the recorded window, from the earliest node's start to the latest node's end;
- ``critical_path_us``: the longest path through the ET's dependencies (data and ctrl), each
  node taking its measured duration (what a simulator that honours both replays as the time to
  finish); ``coverage`` = critical path / span;
- the critical path's time by kind: ``host`` (host COMP nodes), ``device`` (device COMP),
  ``comm`` (COMM nodes on the path: exposed), ``comm_overlapped_us`` (communication off the
  path), ``mem`` (MEM nodes), ``gap`` (``host_gap`` nodes: time between ops, see
  linker/enrich/gaps.py);
- ``top_ops``: the node names that hold most of the critical path;
- ``idle``: per side (host threads, device streams), the time lanes sat idle between the
  window's start and their last op, split into ``explained`` (waiting for a dependency: a
  launch, a sync, another thread, a collective) and ``unexplained`` (the ``host_gap`` nodes:
  slack that the ET copies from the recording). The unexplained share is how much of the ET is
  recording rather than model;
- ``moe``: per MoE layer, the worst imbalance over its routing nodes (max / mean tokens per
  expert); ``kv_bytes``: KV-cache bytes loaded and stored.

Exact times come from the nodes' ``start_ns`` / ``duration_ns`` (or ``_ps``) attributes where
the converter wrote them, else from the microsecond fields. A node whose duration is unknown
counts 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .run_model import GAP, KIND_NAMES, Columns, Strings, columns_of, longest_path
from .schema import COMM_COLL, COMM_RECV, COMM_SEND, MEM_LOAD, MEM_STORE, Node

_COMM = frozenset((COMM_COLL, COMM_SEND, COMM_RECV))
_MEM = frozenset((MEM_LOAD, MEM_STORE))
TOP = 10


@dataclass
class RankStats:
    path: str
    nodes: int
    span_us: float
    critical_path_us: float
    by_kind_us: dict[str, float]
    comm_overlapped_us: float
    top_ops: list[tuple[str, float]]
    moe: dict[int, float] = field(default_factory=dict)
    kv_bytes: dict[str, int] = field(default_factory=dict)
    idle_us: dict[str, dict[str, float]] = field(default_factory=dict)
    # Set when the rank is read with its run (converter/peers.py): its collectives' time split
    # into waiting for a peer and transfer, how much of the exposed communication on its
    # critical path was waiting, and its communication nodes whose peers were not recorded.
    peer_wait_us: float | None = None
    transfer_us: float | None = None
    peer_wait_on_path_us: float = 0.0
    wait_unknown: int = 0
    rank: int | None = None  # where read with its run


    @property
    def coverage(self) -> float:
        return self.critical_path_us / self.span_us if self.span_us else 0.0

    def to_json(self) -> dict:
        return {**({"rank": self.rank} if self.rank is not None else {}),
                "path": self.path, "nodes": self.nodes, "span_us": round(self.span_us, 3),
                "critical_path_us": round(self.critical_path_us, 3),
                "coverage": round(self.coverage, 4),
                "critical_path_by_kind_us": {k: round(v, 3) for k, v in self.by_kind_us.items()},
                "comm_overlapped_us": round(self.comm_overlapped_us, 3),
                "top_ops": [{"name": n, "us": round(t, 3)} for n, t in self.top_ops],
                "moe_max_over_mean_by_layer": {str(k): round(v, 3) for k, v in self.moe.items()},
                "kv_bytes": self.kv_bytes,
                "idle_us": {side: {k: round(v, 3) for k, v in parts.items()}
                            for side, parts in self.idle_us.items()},
                **({"peer_wait_us": round(self.peer_wait_us, 3),
                    "transfer_us": round(self.transfer_us or 0.0, 3),
                    "peer_wait_on_path_us": round(self.peer_wait_on_path_us, 3),
                    "wait_unknown": self.wait_unknown}
                   if self.peer_wait_us is not None else {})}


def span_of(c: Columns) -> float:
    """From the first start to the last end among a rank's timed nodes."""
    starts, durs = c.starts, c.durs
    timed = [p for p in range(len(starts)) if starts[p] == starts[p]]
    return (max(starts[p] + durs[p] for p in timed) - min(starts[p] for p in timed)
            if timed else 0.0)


def rank_stats(path: str, nodes: Sequence[Node] | Columns, waits: dict[int, float] | None = None,
               transfers: dict[int, float] | None = None, unknown: int = 0) -> RankStats:
    """Everything above for one ET's nodes (decoded, or a rank's columns, run_model.py); with
    ``waits`` / ``transfers`` (node id -> us, from converter/peers.py), the split of its
    collectives' time too."""
    c = nodes if isinstance(nodes, Columns) else columns_of(nodes, Strings())[0]
    n = len(c)
    durs, kinds, types = c.durs, c.kinds, c.types
    span = span_of(c)
    finish, via, at = longest_path(c, durs)
    length = finish[at] if at >= 0 else 0.0
    on_path: list[int] = []
    while at >= 0:
        on_path.append(at)
        at = via[at]
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for p in on_path:
        dur = durs[p]
        by_kind[KIND_NAMES[kinds[p]]] += dur
        by_name[c.name(p)] += dur
    path_set = set(on_path)
    overlapped = sum(durs[p] for p in range(n) if types[p] in _COMM and p not in path_set)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:TOP]
    moe: dict[int, float] = {}
    kv: dict[str, int] = defaultdict(int)
    for a in c.extras.values():
        if "moe_expert_tokens" in a:
            bins = list(a["moe_expert_tokens"])
            mean = sum(bins) / len(bins) if bins else 0
            if mean:
                layer = int(a["moe_layer"]) if "moe_layer" in a else -1
                moe[layer] = max(moe.get(layer, 0.0), max(bins) / mean)
        if "kv_direction" in a and "tensor_size" in a:
            kv[str(a["kv_direction"])] += int(a["tensor_size"])
    out = RankStats(path, n, span, length,
                    {k: by_kind.get(k, 0.0) for k in ("host", "device", "comm", "mem", "gap")},
                    overlapped, top, dict(sorted(moe.items())), dict(kv), idle_time(c))
    if waits is not None:
        out.peer_wait_us = sum(waits.values())
        out.transfer_us = sum((transfers or {}).values())
        ids = c.ids
        on_path_ids = set([ids[p] for p in on_path])  # (as the ids were once: same order)
        out.peer_wait_on_path_us = sum(waits.get(nid, 0.0) for nid in on_path_ids)
        out.wait_unknown = unknown
    return out


def idle_time(c: Columns) -> dict[str, dict[str, float]]:
    """Per side, the lanes' idle time from the window's start to each lane's last op, and
    how much of it the gaps hold (unexplained) versus dependencies (explained)."""
    starts, durs, kinds, lanes, cpu = c.starts, c.durs, c.kinds, c.lanes, c.cpu
    timed = [s for s in starts if s == s]
    if not timed:
        return {}
    window_start = min(timed)
    busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    gaps: dict[str, float] = defaultdict(float)
    side_of: dict[str, str] = {}
    names = c.strings.values
    for p in range(len(starts)):
        start = starts[p]
        if start != start or lanes[p] < 0:
            continue
        lane = names[lanes[p]]
        if lane.startswith("comm:"):
            continue  # a host-side collective's own resource: idle there means nothing
        dur = durs[p]
        if kinds[p] == GAP:
            gaps[lane] += dur
            continue
        side_of.setdefault(lane, "host" if cpu[p] else "device")
        busy[lane].append((start, start + dur))
    out = {side: {"idle": 0.0, "explained": 0.0, "unexplained": 0.0} for side in ("host", "device")}
    for lane, spans in busy.items():
        spans.sort()
        covered, reach = 0.0, window_start
        for lo, hi in spans:
            if hi > reach:
                covered += hi - max(lo, reach)
                reach = hi
        idle = reach - window_start - covered
        unexplained = min(gaps.get(lane, 0.0), idle)
        part = out[side_of[lane]]
        part["idle"] += idle
        part["unexplained"] += unexplained
        part["explained"] += idle - unexplained
    return out


def critical_path(nodes: Sequence[Node], dur: dict[int, float]
                  ) -> tuple[dict[int, float], dict[int, int]]:
    """Earliest finish of every node (its duration after the latest of its dependencies) and,
    per node, the dependency that decided its start. Iterative (Kahn): ETs are deep."""
    deps = {n.id: [d for d in (*n.data_deps, *n.ctrl_deps) if d != n.id] for n in nodes}
    users: dict[int, list[int]] = defaultdict(list)
    waiting = {}
    for nid, ds in deps.items():
        known = [d for d in ds if d in deps]
        waiting[nid] = len(known)
        for d in known:
            users[d].append(nid)
    ready = [nid for nid, count in waiting.items() if count == 0]
    start: dict[int, float] = defaultdict(float)
    via: dict[int, int] = {}
    finish: dict[int, float] = {}
    while ready:
        nid = ready.pop()
        finish[nid] = start[nid] + dur.get(nid, 0.0)
        for user in users.get(nid, ()):
            if user not in via or finish[nid] > start[user]:
                start[user], via[user] = finish[nid], nid
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    return finish, via


def short_name(name: str, width: int = 80) -> str:
    """A kernel's C++ signature without its parameters and template arguments, for reading
    (``--json`` keeps the full name): ``void at::native::elementwise_kernel<...>(...)``."""
    if len(name) <= width:
        return name
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            if depth == 0:
                out.append("<...>" if ch == "<" else "(...)")
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = "".join(out)
    return short if len(short) <= width else short[:width - 3] + "..."


def render(ranks: list[RankStats]) -> str:
    lines = []
    for r in ranks:
        k = r.by_kind_us
        if r.span_us or not r.critical_path_us:
            lines.append(f"{r.path}: span {r.span_us / 1e3:,.3f} ms, critical path "
                         f"{r.critical_path_us / 1e3:,.3f} ms ({r.coverage:.1%} of the span)")
        else:
            lines.append(f"{r.path}: no recorded times (an ET without them, as the reference "
                         f"converter writes): critical path {r.critical_path_us / 1e3:,.3f} ms "
                         f"by replay of the nodes' durations")
        lines.append(f"  on the path: host {k['host'] / 1e3:,.3f} ms, device "
                     f"{k['device'] / 1e3:,.3f} ms, communication (exposed) {k['comm'] / 1e3:,.3f}"
                     f" ms, memory {k['mem'] / 1e3:,.3f} ms, gaps {k['gap'] / 1e3:,.3f} ms; "
                     f"communication overlapped {r.comm_overlapped_us / 1e3:,.3f} ms")
        if r.peer_wait_us is not None:
            lines.append(f"  collectives: waiting for peers {r.peer_wait_us / 1e3:,.3f} ms, "
                         f"transfer {(r.transfer_us or 0.0) / 1e3:,.3f} ms; of the exposed "
                         f"communication, {r.peer_wait_on_path_us / 1e3:,.3f} ms was waiting for "
                         f"a peer" + (f"; {r.wait_unknown} with peers not recorded (wait "
                                       f"unknown)" if r.wait_unknown else ""))
        for side, part in r.idle_us.items():
            if part["idle"]:
                lines.append(f"  idle {side} lanes {part['idle'] / 1e3:,.3f} ms: explained by "
                             f"dependencies {part['explained'] / 1e3:,.3f} ms, unexplained (gaps) "
                             f"{part['unexplained'] / 1e3:,.3f} ms "
                             f"({part['unexplained'] / part['idle']:.0%})")
        if r.top_ops:
            tops = ", ".join(f"{short_name(name)} {t / 1e3:,.3f}" for name, t in r.top_ops[:5])
            lines.append(f"  top ops on the path (ms): {tops}")
        if r.moe:
            worst = max(r.moe.items(), key=lambda kv: kv[1])
            lines.append(f"  MoE imbalance (max/mean tokens per expert): worst layer "
                         f"{worst[0]} at {worst[1]:.2f}, {len(r.moe)} "
                         f"layer{'s' if len(r.moe) != 1 else ''}")
        if r.kv_bytes:
            lines.append("  KV cache: " + ", ".join(f"{k} {v:,} B" for k, v in r.kv_bytes.items()))
    if len(ranks) > 1:
        span = max(r.span_us for r in ranks)
        path = max(r.critical_path_us for r in ranks)
        lines.append(f"run of {len(ranks)} ranks: span {span / 1e3:,.3f} ms, longest critical "
                     f"path {path / 1e3:,.3f} ms ({path / span:.1%})" if span else "")
    return "\n".join(lines)
