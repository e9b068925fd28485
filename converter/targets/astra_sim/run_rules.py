"""Rules that hold across the ranks of a run, not inside one file.

A simulator runs every rank's ET together, so what one file says about a collective must agree
with what the other members of its process group say. Found by running our ETs in ASTRA-sim:
- a collective must have the same type and ``comm_size`` on every member, in the same order;
  otherwise the simulator deadlocks and still exits 0;
- ``comm_group.json`` must not have the key "0" (ASTRA-sim reserves 0 for "all ranks" and
  asserts), must name only ranks that have a file, and a group a collective uses needs two
  members or more.

``harmonize`` makes a converted run satisfy those rules for ``--target astra-sim`` (uneven
all-to-all sizes become the largest member's, the rank's own size kept as
``comm_size_local``), and ``check_run`` reports breaches in any run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from chakra_hooks.converter.attrs import attr_dict, make_attr, value_of
from chakra_hooks.converter.graph import round_us
from chakra_hooks.converter.schema import (COMM_COLL, COMM_SEND, COMP,
                                           CollectiveCommType, Node)
ALL_RANKS = ""  # pg_name for the whole run
# On a collective whose group names ranks with no trace (simulated over all ranks): the
# group's members as recorded, from which ``scale`` rebuilds the group once it has made them.
RECORDED_GROUP = "pg_ranks_recorded"


@dataclass(slots=True)
class Collective:
    node: Node
    comm_type: int
    size: int
    group: str  # pg_name as written


def collectives(nodes: Sequence[Node]) -> list[Collective]:
    """COMM_COLL nodes in the order they ran (start time, then id)."""
    found = []
    for node in nodes:
        if node.type != COMM_COLL:
            continue
        attrs = attr_dict(node)
        comm_type = value_of(attrs["comm_type"]) if "comm_type" in attrs else -1
        size = value_of(attrs["comm_size"]) if "comm_size" in attrs else 0
        group = value_of(attrs["pg_name"]) if "pg_name" in attrs else ALL_RANKS
        found.append(Collective(node, int(comm_type), int(size), str(group)))
    found.sort(key=lambda c: (c.node.start_time_micros, c.node.id))
    return found


def _members(group: str, groups: dict[str, list[int]], ranks: list[int]) -> list[int]:
    return ranks if group in (ALL_RANKS, "0") and group not in groups else groups.get(group, ranks)


def _sequences(run: dict[int, Sequence[Node]], groups: dict[str, list[int]]
               ) -> dict[str, dict[int, list[Collective]]]:
    """Per process group, per member rank that has a file: its collectives in order."""
    ranks = sorted(run)
    out: dict[str, dict[int, list[Collective]]] = {}
    for rank, nodes in run.items():
        for coll in collectives(nodes):
            members = _members(coll.group, groups, ranks)
            out.setdefault(coll.group, {m: [] for m in members if m in run})
            out[coll.group].setdefault(rank, []).append(coll)
    return out


def check_run(run: dict[int, Sequence[Node]], groups: dict[str, list[int]]) -> list[str]:
    """Problems across ranks (one line each); ``groups`` is comm_group.json, keys as strings."""
    problems = []
    ranks = sorted(run)
    if "0" in groups:
        problems.append('comm_group.json has the key "0", which ASTRA-sim reserves for all ranks')
    for gid, members in groups.items():
        outside = sorted(set(members) - set(ranks))
        if outside:
            problems.append(f"process group {gid} names ranks {outside[:8]} that have no ET in this run")
    for group, per_rank in _sequences(run, groups).items():
        if group not in (ALL_RANKS, "0") and len(_members(group, groups, ranks)) < 2:
            problems.append(f"process group {group!r} has fewer than two members but runs collectives")
        problems.extend(_disagreements(group, per_rank))
    return problems


def _disagreements(group: str, per_rank: dict[int, list[Collective]]) -> list[str]:
    counts = {rank: len(seq) for rank, seq in per_rank.items()}
    if len(set(counts.values())) > 1:
        return [f"process group {group!r}: ranks run different numbers of collectives {counts}"]
    problems = []
    for index, column in enumerate(zip(*per_rank.values())):
        kinds = {c.comm_type for c in column}
        sizes = {c.size for c in column}
        if len(kinds) > 1 or len(sizes) > 1:
            names = sorted(CollectiveCommType.Name(k) if k in CollectiveCommType.values() else str(k) for k in kinds)
            problems.append(f"process group {group!r}: collective #{index} differs across ranks "
                            f"(types {names}, sizes {sorted(sizes)}; nodes "
                            f"{ {rank: c.node.id for rank, c in zip(per_rank, column)} })")
    return problems


def harmonize(run: dict[int, list[Node]], groups: dict[int, list[int]],
              warn: Callable[[str], None]) -> dict[int, list[int]]:
    """Rewrite a run's collectives in place so that ASTRA-sim runs it; returns the new groups.

    Groups: the one spanning every rank, and any naming ranks with no file here (ASTRA-sim
    cannot run those; their members kept as ``pg_ranks_recorded``), become "" (all ranks);
    single-member groups turn their collectives into
    COMP nodes of the same duration; the rest are renumbered from 1. Sizes: equal across the
    members of a group, the largest, where ranks disagree (uneven all-to-all).
    """
    ranks = sorted(run)
    rename, new_groups = _renumber(groups, ranks, warn)
    outside = {str(gid): sorted(members) for gid, members in groups.items()
               if not set(members) <= set(ranks)}
    for nodes in run.values():
        for coll in collectives(nodes):
            if coll.group in outside:  # kept for `scale`, which makes the missing ranks
                coll.node.attr.append(make_attr(RECORDED_GROUP, outside[coll.group]))
            _regroup(coll, rename)
    for group, per_rank in _sequences(run, {str(k): v for k, v in new_groups.items()}).items():
        for column in _pair_up(group, per_rank, warn):
            _equalize(column, warn)
    for nodes in run.values():
        _chain(collectives(nodes))
    return new_groups


def _chain(sequence: list[Collective]) -> None:
    """Each collective waits for the one before it on its rank (a ctrl dependency).

    ASTRA-sim runs one collective at a time per NPU and starts whichever has its dependencies
    met first; two ranks whose graphs leave two collectives unordered may start them in
    different orders and wait for each other forever (seen on the corpus's sampled ranks). On
    the GPU they ran in the order of their start times (NCCL queues a communicator's work),
    which is the order this keeps. Only between collectives that started at different times,
    so that the edge follows time as every other edge does (no cycle)."""
    for before, after in zip(sequence, sequence[1:]):
        node = after.node
        if (before.node.start_time_micros < node.start_time_micros
                and before.node.start_time_micros + before.node.duration_micros
                <= node.start_time_micros + 1
                and before.node.id not in node.ctrl_deps):
            node.ctrl_deps.append(before.node.id)


def _pair_up(group: str, per_rank: dict[int, list[Collective]], warn: Callable[[str], None]
             ) -> list[tuple[Collective, ...]]:
    """The collectives of a group as columns, one per collective all members ran.

    Ranks whose sequences agree in length and in type at every place pair up in order (sizes
    may differ: an uneven all-to-all). Otherwise the ranks' windows are not aligned, or
    collectives of groups the trace does not name are mixed in: a collective pairs with
    another rank's only where both have the same type and size and ended at the same time (one
    clock offset per rank allowed), on every member, and the rest, which no other member of
    the run is seen to join, are replayed for the time they took (ASTRA-sim would wait
    forever for their partners).
    """
    sequences = list(per_rank.values())
    if len(sequences) < 2 or (len({len(s) for s in sequences}) == 1 and all(
            len({c.comm_type for c in column}) == 1 for column in zip(*sequences))):
        return list(zip(*sequences))
    first, *others = sequences
    maps = [_match_by_end(first, other) for other in others]  # index in first -> in other
    common = sorted(set(range(len(first))).intersection(*maps))
    columns = [(first[i], *(seq[m[i]] for seq, m in zip(others, maps))) for i in common]
    paired = {id(c) for column in columns for c in column}
    unpaired = [c for seq in sequences for c in seq if id(c) not in paired]
    for coll in unpaired:
        _replay_as_compute(coll, "no matching collective on the other ranks of the run")
    counts = {rank: len(seq) for rank, seq in per_rank.items()}
    warn(f"process group {group!r}: ranks ran different collectives ({counts} in all; windows "
         f"not aligned, or groups the trace does not name): {len(columns)} pair up by type, "
         f"size and end time across ranks, {len(unpaired)} others are replayed for their "
         "duration")
    return columns


PAIR_TOLERANCE_US = 1000  # and 5 % of the longer collective's duration


def _end(coll: Collective) -> int:
    return coll.node.start_time_micros + coll.node.duration_micros


def _match_by_end(first: list[Collective], other: list[Collective]) -> dict[int, int]:
    """Which collective of ``other`` is each of ``first``'s: the same type and size, ended at
    the same time (a collective's ranks wait for each other, so they finish together), in the
    same order. One clock offset between the two ranks is allowed: the median, over
    ``first``'s collectives, of the end-time difference to the nearest of ``other``'s of the
    same type and size (true pairs agree on it; the rest scatter)."""
    by_key: dict[tuple[int, int], list[int]] = {}
    for c in other:
        by_key.setdefault((c.comm_type, c.size), []).append(_end(c))
    deltas = []
    for c in first:
        ends = by_key.get((c.comm_type, c.size))
        if ends:
            deltas.append(min((e - _end(c) for e in ends), key=abs))
    if not deltas:
        return {}
    offset = sorted(deltas)[len(deltas) // 2]
    firsts = sorted(range(len(first)), key=lambda i: _end(first[i]))
    theirs = sorted(range(len(other)), key=lambda j: _end(other[j]))
    out: dict[int, int] = {}
    i = j = 0
    while i < len(firsts) and j < len(theirs):  # both in end order: a linear merge
        a, b = first[firsts[i]], other[theirs[j]]
        gap = _end(b) - offset - _end(a)
        tolerance = PAIR_TOLERANCE_US + max(a.node.duration_micros, b.node.duration_micros) // 20
        if abs(gap) <= tolerance and (a.comm_type, a.size) == (b.comm_type, b.size):
            out[firsts[i]] = theirs[j]
            i += 1
            j += 1
        elif gap > 0:
            i += 1
        else:
            j += 1
    return out


_EXACT_DURATIONS = {"duration_ns": 1000, "duration_ps": 1}  # attribute -> ps per unit


def _replay_as_compute(coll: Collective, reason: str) -> None:
    """Make a collective a COMP node of zero duration (no data moved, no partner), its
    measured time kept in ``overlapped_duration_ps``: the device gaps of --target astra-sim
    already hold that time (converter/graph.py's _retarget does the same for collectives
    ASTRA-sim does not simulate)."""
    node = coll.node
    node.type = COMP
    dur_ps = node.duration_micros * 1_000_000
    for attr in node.attr:
        if attr.name in _EXACT_DURATIONS:
            dur_ps = value_of(attr) * _EXACT_DURATIONS[attr.name]
    kept = [a for a in node.attr if a.name not in ("comm_type", "comm_size", "pg_name")]
    del node.attr[:]
    node.attr.extend(kept)
    for attr in node.attr:
        if attr.name in _EXACT_DURATIONS:
            attr.int64_val = 0
    node.duration_micros = 0
    node.attr.append(make_attr("replayed_as_compute", reason))
    node.attr.append(make_attr("overlapped_duration_ps", dur_ps))


def _renumber(groups: dict[int, list[int]], ranks: list[int], warn: Callable[[str], None]
              ) -> tuple[dict[str, str | None], dict[int, list[int]]]:
    """Old pg_name -> new pg_name ("" = all ranks, None = single member: not a collective)."""
    rename: dict[str, str | None] = {}
    kept: list[tuple[list[int], str]] = []
    outside: list[str] = []
    for gid, members in sorted(groups.items()):
        members = sorted(members)
        if members == ranks:
            rename[str(gid)] = ALL_RANKS
        elif not set(members) <= set(ranks):
            outside.append(f"{gid} {members[:8]}")
            rename[str(gid)] = ALL_RANKS
        elif len(members) < 2:
            rename[str(gid)] = None
        else:
            kept.append((members, str(gid)))
    if outside:  # one line, however many groups (a run had 71)
        warn(f"{len(outside)} process group(s) name ranks with no trace in this run ("
             + ", ".join(outside[:4]) + (", ..." if len(outside) > 4 else "")
             + "); their collectives are simulated over all ranks")
    new_groups: dict[int, list[int]] = {}
    by_members: dict[tuple[int, ...], int] = {}
    for members, old in sorted(kept):
        new_id = by_members.setdefault(tuple(members), len(by_members) + 1)
        new_groups[new_id] = members
        rename[old] = str(new_id)
    return rename, new_groups


def _regroup(coll: Collective, rename: dict[str, str | None]) -> None:
    if coll.group not in rename:
        return
    new = rename[coll.group]
    node = coll.node
    if new is None:  # a one-member group moves no data: replay the node from its duration
        _replay_as_compute(coll, "single-member process group")
        return
    for attr in node.attr:
        if attr.name == "pg_name":
            attr.string_val = new
    coll.group = new


def _equalize(column: Sequence[Collective], warn: Callable[[str], None]) -> None:
    if len({c.comm_type for c in column}) > 1:
        warn(f"collectives {[c.node.id for c in column]} differ in type across ranks")
        return
    largest = max(c.size for c in column)
    for coll in column:
        if coll.size != largest:
            for attr in coll.node.attr:
                if attr.name == "comm_size":
                    attr.int64_val = largest
            coll.node.attr.append(make_attr("comm_size_local", coll.size))
            coll.size = largest


def align_windows(run: dict[int, list[Node]], warn: Callable[[str], None]) -> None:
    """Start every rank at the run's first recorded moment: each rank's window anchor
    (linker/enrich/gaps.add_window_anchor, a zero-length gap every rank's first ops wait for) gets
    the time from the earliest rank's window start to its own. A simulator starts all ranks
    together; without this, a rank that began recording late (and the collectives its peers
    waited for meanwhile) would run early. The ranks' clocks are taken to agree (one host,
    or synchronised hosts, as Kineto's epoch clocks are)."""
    anchors = {}
    for rank, nodes in run.items():
        for node in nodes:
            attrs = attr_dict(node)
            if "window_anchor" in attrs:
                unit = "ns" if "start_ns" in attrs else "ps"
                anchors[rank] = (node, unit, int(value_of(attrs[f"start_{unit}"])))
    if len(anchors) < 2:
        return
    scale = {"ns": 1000, "ps": 1}
    starts = {rank: start * scale[unit] for rank, (_, unit, start) in anchors.items()}
    first = min(starts.values())
    spread = max(starts.values()) - first
    if spread > 10**12:  # a second: not the skew of one run's ranks
        warn(f"the ranks' windows start up to {spread / 1e12:.1f} s apart: their clocks seem "
             "to differ; each rank starts at its own window's start")
        return
    for rank, (node, unit, _) in anchors.items():
        offset = starts[rank] - first
        node.start_time_micros = round_us(first)
        node.duration_micros = round_us(starts[rank]) - round_us(first)
        _set_int(node, f"start_{unit}", first // scale[unit])
        _set_int(node, f"duration_{unit}", offset // scale[unit])
        _set_int(node, "gap_ns", offset // 1000)


def _set_int(node: Node, name: str, value: int) -> None:
    for attr in node.attr:
        if attr.name == name:
            attr.CopyFrom(make_attr(name, value))
            return


def comm_rows(nodes: Iterable[Node]) -> list[tuple[int, int, float | None, float]]:
    """(id, type, start us or None, duration us) of decoded nodes, for ``one_at_a_time``."""
    from chakra_hooks.converter.run_model import node_times

    return [(node.id, node.type, *node_times(node, attr_dict(node))) for node in nodes]


def one_at_a_time(run: dict[int, Iterable[tuple[int, int, float | None, float]]],
                  transfer: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """(rank, node id) -> the share of the network's time each collective and send of a rank
    is fitted to, where ASTRA-sim runs them one after another. Its hardware model keeps one
    communication op in flight per NPU (receives excepted), while a run can have several at
    once (gloo runs DDP's buckets on two threads; NCCL has several streams). Communication
    whose transfers overlapped shares the time they covered together: each one's transfer
    (``transfer``, or its whole time where it has none) is scaled by that time over their sum,
    so that run one after another they take as long as they did at once. ``run``: per rank,
    (id, type, start us or None, duration us) of its communication nodes in the ET's order
    (``comm_rows``, or run_model's ``Rank.comm_nodes``)."""
    out: dict[tuple[int, int], float] = {}
    for rank, rows in run.items():
        spans = []  # (transfer start, end, node id, transfer)
        for nid, node_type, start, dur in rows:
            if node_type not in (COMM_COLL, COMM_SEND):
                continue
            if start is None or (node_type == COMM_SEND and (rank, nid) not in transfer):
                continue  # (a send whose receive is not here is not fitted)
            took = transfer.get((rank, nid), dur)
            spans.append((start + dur - took, start + dur, nid, took))
        spans.sort()
        cluster: list[tuple[float, float, int, float]] = []
        reach = float("-inf")  # where the cluster's transfers end
        for span in spans + [(float("inf"), float("inf"), -1, 0.0)]:
            if cluster and span[0] >= reach:
                share = 1.0
                if len(cluster) > 1:
                    total = sum(c[3] for c in cluster)
                    share = (reach - cluster[0][0]) / total if total else 0.0
                for _, _, node_id, took in cluster:
                    out[(rank, node_id)] = took * share
                cluster, reach = [], float("-inf")
            cluster.append(span)
            reach = max(reach, span[1])
    return out
