"""Ranks that wait for each other: the same collective found on every member of its group, each
member's recorded time split into waiting for a peer and the transfer, the ranks' clocks put
on one time base, and the whole run replayed with collectives that start when their last
member arrives (``whatif`` and ``stats`` over several ranks).

A collective cannot finish before its last member has started it. So for one collective
matched across its members, with S = the latest (clock-corrected) start over them:
``peer wait`` of a member = S - its start, ``transfer`` = its end - S (both clipped to its own
duration). A send and its receive are matched the same way (S: the later of the two starts).

Matching: per process group (``pg_name``; its members from ``comm_group.json`` beside the ETs,
an empty name or "0" meaning the whole run), the i-th collective of every member in start
order; the i-th send from a rank to a peer with a tag, with the i-th receive of that peer from
that rank with that tag. No trace here carries NCCL sequence numbers, so the order is the
sequence: ranks run a group's collectives in the same order. A group whose members were not
all recorded (the ETs' ``world_size`` says how many the run had), or whose members recorded
different numbers of collectives, is not matched: its collectives keep their whole recorded
time, as one rank's replay treats them, and are counted as ``wait unknown``.

Clocks: the ends of a symmetric collective (all-reduce, all-gather, reduce-scatter,
all-to-all, barrier) nearly coincide on every member, whatever each started. Each rank's offset
is the median, over the matched symmetric collectives it is in, of its end minus the median end
of the collective's members; offsets are applied where they make the ends' spread
(``clock_residual_us``, the median distance of an end from its collective's median end) smaller
and are three times what is left of it at least. Ranks whose recording names their machine's
clock (``host_clock`` in the ET's metadata, written from our collectors' manifests) share one
offset per clock, and ranks all on one clock get none: a ring all-reduce (gloo's) does not end
at one moment on every member, and a rank late to every collective is a straggler, not a clock.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from .attrs import value_of
from .run_model import COMM, Columns, Rank, Strings, host_and_clock, ranks_at_least
from .schema import COMM_COLL, COMM_RECV, COMM_SEND, COMM_TYPE_NAMES

if TYPE_CHECKING:  # the protobuf classes: a conversion matches without loading them
    from .schema import Node

ALL_RANKS = ("", "0")  # pg_name of the whole run (ASTRA-sim's empty name; torch's group 0)
SYMMETRIC = frozenset(COMM_TYPE_NAMES.index(name) for name in
                      ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL", "BARRIER"))


Key = tuple[int, int]  # (rank, node id)


def attr_value(attrs: Mapping[str, object], name: str) -> object:
    """An attribute's value, from an ET's AttributeProto or from a worker's plain value."""
    value = attrs[name]
    return value_of(value) if hasattr(value, "WhichOneof") else value


def ranks_from_facts(facts: Mapping[int, Sequence[tuple]],
                     hosts: Mapping[int, Mapping[str, object]] | None = None) -> list[Rank]:
    """Ranks of the communication nodes the workers handed over (rank -> ``comm_facts``),
    with the ``host`` and ``host_clock`` of each where ``hosts`` (rank -> ET metadata) has
    them."""
    # From the run's first start, in integers until then: epoch microseconds as floats are
    # 0.25 us apart.
    origin = min((row[3] for rows in facts.values() for row in rows if row[3] is not None),
                 default=0)
    strings = Strings()
    ranks = []
    for rank, rows in sorted(facts.items()):
        columns, comm = Columns(strings), {}
        for _, nid, node_type, start_ps, dur_ps, attrs in rows:
            columns.append(nid, node_type, None if start_ps is None else (start_ps - origin) / 1e6,
                           0.0 if dur_ps is None else dur_ps / 1e6, COMM)
            comm[nid] = {k: v for k, v in attrs.items() if v is not None}
        ranks.append(Rank(rank, "", columns, comm, *host_and_clock((hosts or {}).get(rank))))
    return ranks


@dataclass
class RankPeers:
    """One rank's part of ``Peers``."""

    wait_us: dict[int, float] = field(default_factory=dict)  # node id -> us
    transfer_us: dict[int, float] = field(default_factory=dict)
    unknown: int = 0


@dataclass
class Peers:
    """What matching found: ``columns`` (each the members of one collective, or a send and
    its receive, as keys), each matched node's ``wait_us`` / ``transfer_us``, the ``unknown``
    communication nodes (members not all recorded), the clock ``offsets_us`` applied per rank
    (subtracted from its times), and notes for the user."""

    columns: list[list[Key]] = field(default_factory=list)
    wait_us: dict[Key, float] = field(default_factory=dict)
    transfer_us: dict[Key, float] = field(default_factory=dict)
    unknown: set[Key] = field(default_factory=set)
    offsets_us: dict[int, float] = field(default_factory=dict)
    clock_residual_us: float = 0.0
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the ETs disagree with each other

    def by_rank(self) -> dict[int, RankPeers]:
        """Per rank: its nodes' peer waits and transfers (node id -> us), and how many of its
        communication nodes have their wait unknown."""
        out: dict[int, RankPeers] = defaultdict(RankPeers)
        for (rank, nid), wait in self.wait_us.items():
            out[rank].wait_us[nid] = wait
        for (rank, nid), moved in self.transfer_us.items():
            out[rank].transfer_us[nid] = moved
        for rank, _ in self.unknown:
            out[rank].unknown += 1
        return out

    def last_arrival(self, column: Sequence[Key]) -> Key:
        """The member the others waited for (no wait of its own)."""
        return min(column, key=lambda k: (self.wait_us[k], k))


def _collectives(rank: Rank) -> list[tuple[str, int]]:
    """(group, node id) of the rank's timed collectives, in the order they started."""
    found = []
    for nid, node_type, start, _ in rank.comm_nodes():
        if node_type != COMM_COLL or start is None:
            continue
        a = rank.comm[nid]
        found.append((start, nid, str(attr_value(a, "pg_name")) if "pg_name" in a else ""))
    found.sort(key=lambda found: found[:2])
    return [(group, nid) for _, nid, group in found]


def members_of(group: str, groups: Mapping[str, Sequence[int]], world: int) -> list[int] | None:
    """The ranks of a process group (``pg_name``): comm_group.json's, the whole run for its
    default group, else None (not known)."""
    if group in groups:
        return list(groups[group])
    return list(range(world)) if group in ALL_RANKS else None


def match(ranks: Sequence[Rank], groups: Mapping[str, Sequence[int]], world: int) -> Peers:
    """Collectives and send / receive pairs matched across the ranks given (module docstring)."""
    peers = Peers()
    unmatched: dict[str, list[tuple[str, int]]] = defaultdict(list)  # why -> [(group, count)]
    present = {r.rank: r for r in ranks}
    by_group: dict[str, dict[int, list[int]]] = defaultdict(dict)
    for r in ranks:
        for group, nid in _collectives(r):
            by_group[group].setdefault(r.rank, []).append(nid)
    for group, per_rank in by_group.items():
        members = members_of(group, groups, world)
        missing = [m for m in members if m not in present] if members is not None else None
        counts = {rank: len(seq) for rank, seq in per_rank.items()}
        if members is not None and not missing and len(members) == 1:  # a run of one: no peer
            peers.columns += [[(members[0], nid)] for nid in per_rank.get(members[0], ())]
            continue
        if members is None or missing or len(set(counts.values())) > 1 or len(counts) < 2:
            for rank, seq in per_rank.items():
                peers.unknown.update((rank, nid) for nid in seq)
            if members is None:
                why = "their members are not known (no comm_group.json entry)"
            elif missing:
                why = f"{len(missing)} of {len(members)} members not recorded"
            elif len(counts) < 2:
                why = "one member holds them"
            else:
                why = f"members recorded different numbers of them {counts}"
            unmatched[why].append((group or "of all ranks", sum(counts.values())))
            continue
        ranks_in = sorted(per_rank)
        for column in zip(*(per_rank[rank] for rank in ranks_in)):
            peers.columns.append(list(zip(ranks_in, column)))
    for why, where in unmatched.items():  # one line per reason, however many groups
        names = ", ".join(repr(g) for g, _ in where[:4]) + (", ..." if len(where) > 4 else "")
        if why.startswith("members recorded different numbers"):  # every member recorded
            peers.warnings.append(f"the ranks disagree on process group(s) {names}: {why} "
                                  "(a collective's group changed, or ETs of different windows)"
                                  "; their waits for peers are unknown")
        peers.notes.append(f"{sum(n for _, n in where)} collectives of {len(where)} process "
                           f"group(s) ({names}) keep their recorded time, waits for peers "
                           f"unknown: {why}")
    _match_sends(ranks, peers)
    return peers


def _match_sends(ranks: Sequence[Rank], peers: Peers) -> None:
    sides: dict[tuple[int, int, int], dict[int, list]] = defaultdict(lambda: defaultdict(list))
    present = {r.rank for r in ranks}
    for r in ranks:
        for nid, node_type, start, _ in r.comm_nodes():
            if node_type not in (COMM_SEND, COMM_RECV) or start is None:
                continue
            a = r.comm[nid]
            if "comm_src" not in a or "comm_dst" not in a:
                peers.unknown.add((r.rank, nid))
                continue
            key = (int(attr_value(a, "comm_src")), int(attr_value(a, "comm_dst")),
                   int(attr_value(a, "comm_tag")) if "comm_tag" in a else 0)
            sides[key][node_type].append((start, nid, r.rank))
    for (src, dst, _), by_type in sides.items():
        sends, recvs = sorted(by_type.get(COMM_SEND, ())), sorted(by_type.get(COMM_RECV, ()))
        if src not in present or dst not in present or len(sends) != len(recvs):
            peers.unknown.update((rank, nid) for _, nid, rank in (*sends, *recvs))
            continue
        for (_, send_id, send_rank), (_, recv_id, recv_rank) in zip(sends, recvs):
            peers.columns.append([(send_rank, send_id), (recv_rank, recv_id)])


def clock_offsets(ranks: Sequence[Rank], peers: Peers) -> None:
    """Each rank's clock offset from the ends of the matched symmetric collectives (module
    docstring); sets ``peers.offsets_us`` and ``clock_residual_us``. Ranks that recorded one
    clock (the same ``clock``: one machine) get one offset, and ranks all on one clock none."""
    by_rank = {r.rank: r for r in ranks}
    domain = {r.rank: r.clock or f"rank {r.rank}" for r in ranks}
    ends: list[dict[int, float]] = []
    for column in peers.columns:
        if len(column) < 2:
            continue
        rank0, nid0 = column[0]
        a = by_rank[rank0].comm[nid0]
        if "comm_type" in a and int(attr_value(a, "comm_type")) in SYMMETRIC:
            ends.append({rank: sum(by_rank[rank].time(nid)) for rank, nid in column})
    residuals: dict[str, list[float]] = defaultdict(list)
    for column_ends in ends:
        middle = statistics.median(column_ends.values())
        for rank, end in column_ends.items():
            residuals[domain[rank]].append(end - middle)
    spread = _spread(ends, {})
    peers.clock_residual_us = spread
    if len(residuals) > 1:
        by_domain = {d: statistics.median(values) for d, values in residuals.items()}
        offsets = {rank: by_domain[domain[rank]] for column_ends in ends for rank in column_ends}
        corrected = _spread(ends, offsets)
        # Applied where they line the ends up better, and stand out from what is left (ends
        # that still disagree by as much are not clocks but the collectives themselves).
        if max(abs(v) for v in offsets.values()) > max(corrected, 1.0) * 3 and corrected < spread:
            peers.offsets_us = offsets
            peers.clock_residual_us = corrected
            shared = len(set(domain.values())) < len(domain)
            peers.notes.append("ranks' clocks disagree: offsets (us) " + ", ".join(
                f"rank {rank} {value:+,.1f}" for rank, value in sorted(offsets.items())
                if value) + (" (ranks of one machine share one)" if shared else "")
                + f" taken from {len(ends)} collectives' ends (residual {corrected:,.1f} us,"
                f" {spread:,.1f} before)")
    if ends and peers.clock_residual_us > 1000 and len(residuals) > 1:  # (one clock: not wrong)
        peers.notes.append(f"collectives' ends do not line up across ranks (median distance "
                           f"{peers.clock_residual_us:,.0f} us after clock correction): the "
                           f"matching or the clocks are wrong; waits may be too")


def _spread(ends: list[dict[int, float]], offsets: Mapping[int, float]) -> float:
    distances = []
    for column_ends in ends:
        shifted = {rank: end - offsets.get(rank, 0.0) for rank, end in column_ends.items()}
        middle = statistics.median(shifted.values())
        distances += [abs(end - middle) for end in shifted.values()]
    return statistics.median(distances) if distances else 0.0


def split(ranks: Sequence[Rank], peers: Peers) -> None:
    """Each matched node's peer wait and transfer (us), on the corrected clocks."""
    by_rank = {r.rank: r for r in ranks}
    for column in peers.columns:
        starts = {}
        for rank, nid in column:
            start, _ = by_rank[rank].time(nid)
            starts[(rank, nid)] = start - peers.offsets_us.get(rank, 0.0)
        last = max(starts.values())
        for key, start in starts.items():
            dur = by_rank[key[0]].time(key[1])[1]
            wait = min(max(last - start, 0.0), dur)
            peers.wait_us[key] = wait
            peers.transfer_us[key] = dur - wait


WAIT_ATTR, UNKNOWN_ATTR = "peer_wait_ns", "peer_wait_unknown"


def annotate_facts(facts: Mapping[int, Sequence[tuple]], groups: Mapping[str, Sequence[int]],
                   world: int, hosts: Mapping[int, Mapping[str, object]] | None = None
                   ) -> tuple[Peers, dict[int, list[tuple[int, bytes]]]]:
    """At conversion, from the workers' ``comm_facts`` (rank -> rows): the Peers, and per rank
    the attribute to add to each communication node, as (place in the ET's nodes, serialised
    AttributeProto): ``peer_wait_ns`` (its wait for the last member; its transfer is its
    duration minus that) on each matched one, ``peer_wait_unknown`` on each whose peers were
    not all recorded."""
    from .wire import encode_attr

    ranks = ranks_from_facts(facts, hosts)
    peers = analyse(ranks, groups, world)
    additions: dict[int, list[tuple[int, bytes]]] = {}
    for rank, rows in facts.items():
        out = additions[rank] = []
        for index, nid, *_ in rows:
            key = (rank, nid)
            if key in peers.wait_us:
                out.append((index, encode_attr(WAIT_ATTR, round(peers.wait_us[key] * 1000))))
            elif key in peers.unknown:
                out.append((index, encode_attr(UNKNOWN_ATTR, True)))
    return peers, additions


def annotate_nodes(run: Mapping[int, Sequence[Node]], peers: Peers) -> None:
    """``peer_wait_ns`` on each matched communication node of ``run`` (rank -> decoded nodes,
    changed in place), ``peer_wait_unknown`` on each whose peers were not all recorded, as
    ``peers`` found them (from the facts, so to the picosecond, as ``annotate_facts`` writes)."""
    from .attrs import make_attr

    for rank, nodes in run.items():
        for node in nodes:
            key = (rank, node.id)
            if key in peers.wait_us:
                node.attr.append(make_attr(WAIT_ATTR, round(peers.wait_us[key] * 1000)))
            elif key in peers.unknown:
                node.attr.append(make_attr(UNKNOWN_ATTR, True))


def analyse(ranks: Sequence[Rank], groups: Mapping[str, Sequence[int]] | None = None,
            world: int | None = None) -> Peers:
    """match, clock_offsets and split, for the ranks of one run."""
    peers = match(ranks, dict(groups or {}), world or ranks_at_least(ranks))
    clock_offsets(ranks, peers)
    split(ranks, peers)
    made = sorted((r.rank, r.made_from) for r in ranks if r.made_from is not None)
    if made:
        sources = sorted({source for _, source in made})
        peers.notes.append(f"{len(made)} of {len(ranks)} ranks were not recorded but made by "
                           f"chakra-hooks scale (ranks {listed([m for m, _ in made])}), copies "
                           f"of recorded rank(s) {listed(sources)} with transfers modelled for "
                           "their groups; every rank's times are the replay's of the scaled "
                           "run, not measurements")
    return peers


def listed(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        start = r if start is None else start
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)
