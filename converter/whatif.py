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

Ranks are replayed one by one: a collective's measured time includes waiting for its slowest
peer, so scaling it scales that wait too. The predicted span of a rank is the replay's finish;
what moved is the critical path's make-up before and after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from chakra_hooks.linker.enrich.gaps import GAP_NAME

from .attrs import attr_dict, value_of
from .schema import COMM_COLL, COMM_RECV, COMM_SEND, CollectiveCommType, Node
from .stats import critical_path, node_times, span_us

_COMM = frozenset((COMM_COLL, COMM_SEND, COMM_RECV))
COMM_TYPES = {CollectiveCommType.Name(v).lower(): v for v in CollectiveCommType.values()}
KINDS = ("compute", "comm", "gap")


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

    def to_json(self) -> dict:
        return {"path": self.path, "span_us": round(self.span_us, 3),
                "replayed_us": round(self.replayed_us, 3),
                "predicted_us": round(self.predicted_us, 3),
                "change": round(self.predicted_us / self.replayed_us - 1, 4)
                if self.replayed_us else 0.0,
                "critical_path_before_us": {k: round(v, 3) for k, v in self.before_us.items()},
                "critical_path_after_us": {k: round(v, 3) for k, v in self.after_us.items()}}


def _kind(node: Node) -> str:
    if node.name == GAP_NAME:
        return "gap"
    return "comm" if node.type in _COMM else "compute"


def collectives_in_order(nodes: Sequence[Node], times: dict[int, tuple]) -> list[Node]:
    """The communication nodes of one ET in the order they started (then by id)."""
    comm = [n for n in nodes if n.type in _COMM and times[n.id][0] is not None]
    return sorted(comm, key=lambda n: (times[n.id][0], n.id))


def durations(nodes: Sequence[Node], attrs: dict[int, dict], times: dict[int, tuple],
              change: Change = Change(), measured_elsewhere: Sequence[float] | None = None,
              path: str = "") -> tuple[dict[int, float], dict[int, float]]:
    """Per node id, (the measured duration, the changed one), us. ``measured_elsewhere``: each
    collective in start order takes those durations (ValueError when the counts differ)."""
    measured = {i: d for i, (_, d) in times.items()}
    changed = dict(measured)
    by_type = change.comm_by_type or {}
    for node in nodes:
        kind = _kind(node)
        if kind == "compute":
            changed[node.id] *= change.compute
        elif kind == "comm":
            factor = change.comm
            a = attrs[node.id]
            if "comm_type" in a and int(value_of(a["comm_type"])) in by_type:
                factor = by_type[int(value_of(a["comm_type"]))]
            changed[node.id] *= factor
    if measured_elsewhere is not None:
        ordered = collectives_in_order(nodes, times)
        if len(ordered) != len(measured_elsewhere):
            raise ValueError(f"{path}: {len(ordered)} collectives, but the other run has "
                             f"{len(measured_elsewhere)} for this rank: not the same program")
        for node, dur in zip(ordered, measured_elsewhere):
            changed[node.id] = dur
    return measured, changed


def replay(path: str, nodes: Sequence[Node], change: Change = Change(),
           measured_elsewhere: Sequence[float] | None = None) -> RankWhatIf:
    """One rank's replay before and after ``change`` (and, with ``measured_elsewhere``, each
    collective in start order taking those durations, us)."""
    attrs = {n.id: attr_dict(n) for n in nodes}
    times = {n.id: node_times(n, attrs[n.id]) for n in nodes}
    span = span_us(times)
    measured, changed = durations(nodes, attrs, times, change, measured_elsewhere, path)
    before = _path(nodes, measured)
    after = _path(nodes, changed)
    return RankWhatIf(path, span, before[0], after[0], before[1], after[1])


def _path(nodes: Sequence[Node], dur: dict[int, float]) -> tuple[float, dict[str, float]]:
    finish, via = critical_path(nodes, dur)
    if not finish:
        return 0.0, dict.fromkeys(KINDS, 0.0)
    by_node = {n.id: n for n in nodes}
    made_of = dict.fromkeys(KINDS, 0.0)
    at = max(finish, key=finish.get)
    length = finish[at]
    while at is not None:
        made_of[_kind(by_node[at])] += dur.get(at, 0.0)
        at = via.get(at)
    return length, made_of


def collective_durations(nodes: Sequence[Node]) -> list[float]:
    """Measured durations (us) of one ET's collectives in start order (for ``comm_from``)."""
    attrs = {n.id: attr_dict(n) for n in nodes}
    times = {n.id: node_times(n, attrs[n.id]) for n in nodes}
    return [times[n.id][1] for n in collectives_in_order(nodes, times)]


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


def render(ranks: Sequence[RankWhatIf], change: str) -> str:
    lines = [f"what if: {change}"]
    for r in ranks:
        delta = r.predicted_us / r.replayed_us - 1 if r.replayed_us else 0.0
        b, a = r.before_us, r.after_us
        lines.append(f"{r.path}: measured {r.span_us / 1e3:,.3f} ms, replayed "
                     f"{r.replayed_us / 1e3:,.3f} ms, predicted {r.predicted_us / 1e3:,.3f} ms "
                     f"({delta:+.1%})")
        lines.append("  critical path, before -> after (ms): " + ", ".join(
            f"{k} {b[k] / 1e3:,.3f} -> {a[k] / 1e3:,.3f}" for k in KINDS))
    if len(ranks) > 1:
        before = max(r.replayed_us for r in ranks)
        after = max(r.predicted_us for r in ranks)
        lines.append(f"run of {len(ranks)} ranks (slowest rank): replayed {before / 1e3:,.3f} ms, "
                     f"predicted {after / 1e3:,.3f} ms ({after / before - 1:+.1%})")
    return "\n".join(lines)
