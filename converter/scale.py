"""``chakra-hooks scale``: a converted run as Chakra ETs for more ranks than were recorded.

Two things make ranks that were not recorded:

- **Completion** (``--world N`` with N the recorded run's size, which its ETs state): a rank
  of the run that has no ET (Megatron-Bridge profiles rank 0 only by default) takes the ET of
  the nearest recorded rank by number (ties: the lower one). Ranks next to each other share
  the most: a tensor-parallel group, a host. Its process groups are its source's, each seen
  from the made rank: the same group where the made rank is a member of it, else the group of
  the run of the same shape that holds it, else the one holding it among the source's group's
  shifted copies that partition the run (a trace lists only the groups its rank is in;
  tensor-, pipeline- and data-parallel groups partition the ranks).
- **Growth** (``--dp Kx``, or ``--world N`` with N a multiple of the run's size): the
  (completed) run is copied K times, copy c's rank r becoming rank c * W + r. Groups that
  span the whole recorded run grow to the whole new one, as do the groups named with
  ``--grow`` (else those the traces describe as data parallel: ``pg_desc``, kept by the
  converter as the metadata's ``data_parallel_groups``); every other group is copied with its
  copy (tensor- or pipeline-parallel groups keep their size). Data parallelism is outermost in this layout, as in torch's default
  device mesh; the whole-run groups are the data-parallel ones in a data-parallel run, and
  ``--grow`` names the data-parallel groups of a run with other dimensions (the traces name
  groups by number only, so which groups are data parallel is the user's to say).

Made ranks are copies: each keeps its source's compute, and a straggler's copies are
stragglers too (copy c of a run with one slow rank has one slow rank), so the new run keeps
the recorded share of slow ranks. Collective sizes stay as recorded (more ranks, the same
work each).

Transfers at the new size: each communication node's transfer (converter/peers.py) is the
fitted network model's time at the new group size (converter/network_change.py, the formulas
of converter/targets/astra_sim/network.py: what ASTRA-sim computes for the node), on the
network fitted to the (completed) recorded run, or on ``--network FILE.yml``'s (an ASTRA-sim
network file; with two dimensions, ranks n // npus_count[0] share a host); a rank's modelled
transfers run one at a time (``whatif.replay_schedule``). Made ranks arrive as late as the
recorded rank waited for peers never recorded (``_late_sources``). The new run is
then replayed with its ranks together (converter/whatif.py) and written with the replayed
times, so ``stats``, ``whatif`` and ``timeline`` read it like any conversion; each made rank's
metadata names the rank it was made from (``made_from_rank``).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from chakra_hooks import storage
from chakra_hooks.common.errors import TraceFormatError

from . import etio
from . import network_change as nets
from . import peers as run_peers
from . import run_model
from . import whatif
from .attrs import attr_dict, make_attr, value_of
from .run_model import COMM_TYPES
from .schema import COMM_COLL, COMM_RECV, COMM_SEND
from .stats import span_of
from .targets.astra_sim import network as fitting
from .targets.astra_sim.run_rules import RECORDED_GROUP

MADE_ATTR = "made_from_rank"
DATA_PARALLEL_ATTR = "data_parallel_groups"  # metadata: ids of groups described as DP
SCALED_ATTR = "scaled_from_world_size"


@dataclass
class Plan:
    """Which recorded rank each new rank is made from, and the new run's process groups."""

    recorded_world: int
    world: int
    recorded: list[int]
    source: dict[int, int] = field(default_factory=dict)  # new rank -> recorded rank
    group_of: dict[int, dict[str, str]] = field(default_factory=dict)  # rank -> pg -> new pg
    groups: dict[str, list[int]] = field(default_factory=dict)  # the new comm_group.json
    grown: list[str] = field(default_factory=list)  # recorded groups that grew
    described: list[str] = field(default_factory=list)  # of them, those the traces named DP

    @property
    def made(self) -> list[int]:
        return [n for n, r in self.source.items() if n != r]

    def peer(self, rank: int, recorded_peer: int) -> int | None:
        """A send's or receive's peer as seen from new rank ``rank`` (None: outside the run)."""
        copy, place = divmod(rank, self.recorded_world)
        # The peer moved as far as the rank is from its source, within the rank's copy.
        inside = recorded_peer + place - self.source[rank]
        return copy * self.recorded_world + inside if 0 <= inside < self.recorded_world else None


def make_plan(recorded: Sequence[int], recorded_world: int, groups: Mapping[str, Sequence[int]],
              world: int, grow: Sequence[str] = ()) -> Plan:
    """``Plan`` for a run recorded on ``recorded`` of ``recorded_world`` ranks, made ``world``
    ranks (module docstring). ValueError where that cannot be done."""
    W = recorded_world
    if world < W or world % W:
        raise ValueError(f"--world {world}: the run has {W} ranks; a larger run is a whole "
                         f"number of copies of it (a multiple of {W})")
    known = {name: sorted(int(m) for m in members) for name, members in groups.items()}
    for name in grow:
        if name not in known:
            raise ValueError(f"--grow {name!r}: no such process group in comm_group.json "
                             f"(groups: {', '.join(sorted(known, key=_group_order)) or 'none'})")
    whole = list(range(W))
    growing = {name for name, members in known.items() if members == whole} | set(grow)
    plan = Plan(W, world, sorted(recorded), grown=sorted(growing, key=_group_order))
    by_members = {tuple(m): name for name, m in known.items()}
    names = [int(k) for k in known if k.isdigit()]
    next_name = [max(names, default=0) + 1]

    def name_for(members: list[int]) -> str:
        key = tuple(members)
        if key not in by_members:
            by_members[key] = str(next_name[0])
            next_name[0] += 1
        return by_members[key]

    # Within the recorded run: each rank's view of each of its source's groups.
    within: dict[int, dict[str, list[int] | None]] = {}
    for p in range(W):
        r = min(plan.recorded, key=lambda q: (abs(q - p), q))
        plan.source[p] = r
        view: dict[str, list[int] | None] = {}
        for name, members in known.items():
            if r not in members:
                continue
            if p in members:
                view[name] = members
            else:  # (a group that grows too: its copy holding p grows, not the source's)
                view[name] = _shifted_group(members, p, r, known.values(), W)
        within[p] = view
    new_groups: dict[str, list[int]] = {}
    copies = world // W
    for n in range(world):
        c, p = divmod(n, W)
        if n >= W:
            plan.source[n] = plan.source[p]
        mine = plan.group_of[n] = {}
        for name, members in within[p].items():
            if members is None:
                continue
            if name in growing:
                grown = sorted({m + k * W for m in members for k in range(copies)})
                new_name = mine[name] = name if members == known[name] else name_for(grown)
                new_groups[new_name] = grown
            else:
                moved = [m + c * W for m in members]
                new_name = mine[name] = name_for(moved)
                new_groups[new_name] = moved
    for name in ("", "0"):  # the whole run when comm_group.json does not list it
        if name not in known:
            for n in range(world):
                plan.group_of[n][name] = name
    plan.groups = dict(sorted(new_groups.items(), key=lambda kv: _group_order(kv[0])))
    return plan


def _group_order(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def _shifted_group(members: list[int], p: int, r: int, known, W: int) -> list[int] | None:
    """Rank ``p``'s counterpart of group ``members`` of rank ``r`` (module docstring): a group
    of the run of the same shape that holds ``p``, else the one holding ``p`` among the
    group's shifted copies that partition the run (tensor-, pipeline- and data-parallel groups
    do: {0, 1} gives {2, 3}, {0, 2} gives {1, 3}), else None."""
    size = len(members)
    for other in known:
        other = sorted(other)
        if len(other) == size and p in other and p not in members:
            delta = other[0] - members[0]
            if all(a + delta == b for a, b in zip(members, other)):
                return other
    covered: set[int] = set()
    for first in range(W):  # the shifted copies of the group that partition the run
        if first in covered:
            continue
        copy = [m + first - members[0] for m in members]
        if any(m >= W or m in covered for m in copy):
            return None  # they do not
        if p in copy:
            return copy
        covered.update(copy)
    return None


@dataclass
class Scaled:
    """What ``scale_run`` wrote and found."""

    plan: Plan
    files: list[Path]
    recorded_span_us: float
    replayed_us: float  # the recorded (completed) run replayed
    predicted_us: float  # the new run replayed
    network: str  # where the network came from
    notes: list[str]
    compute_us: dict[int, float] = field(default_factory=dict)  # per recorded rank


def scale_run(folder: Path, out: Path, world: int | None = None, dp: int | None = None,
              grow: Sequence[str] = (), network_file: str | None = None) -> Scaled:
    """Write ``folder``'s conversion scaled (module docstring) to ``out`` (replaced whole)."""
    ets = sorted((p for p in folder.iterdir() if p.name.endswith((".et", ".et.gz"))),
                 key=lambda p: (etio.name_and_rank(p)[0], etio.name_and_rank(p)[1] or 0))
    if not ets:
        raise TraceFormatError(folder, "folder", "a conversion's output (chakra.<rank>.et "
                               "files): `chakra-hooks convert` writes one")
    recorded: dict[int, tuple[Path, object]] = {}
    described: set[str] = set()  # groups whose description says data parallel (the traces')
    machines: dict[int, tuple[str | None, str | None]] = {}  # rank -> (host, host_clock)
    recorded_world = 0
    for path in ets:
        et = etio.read_et(path)
        meta = {a.name: value_of(a) for a in et.metadata.attr}
        rank = meta.get("rank")
        if not isinstance(rank, int):
            rank = etio.name_and_rank(path)[1]
        if rank is None:
            raise TraceFormatError(path, "metadata", "the rank (metadata 'rank' or a name "
                                   "<prefix>.<rank>.et)")
        if isinstance(meta.get(MADE_ATTR), int):
            raise TraceFormatError(path, "metadata", f"a recorded rank; rank {rank} was made by "
                                   f"scale from rank {meta[MADE_ATTR]}: scale the recorded run")
        if rank in recorded:  # one ET under two names (a one-rank astra-sim conversion)
            continue
        recorded[rank] = (path, et)
        machines[rank] = run_model.host_and_clock(meta)
        described.update(str(g) for g in meta.get(DATA_PARALLEL_ATTR, ()))
        if isinstance(meta.get("world_size"), int):
            recorded_world = max(recorded_world, meta["world_size"])
    recorded_world = max(recorded_world, max(recorded) + 1)
    groups = run_model.read_groups(folder)
    if world is not None and dp is not None:
        raise ValueError("--world and --dp both give the new run's size: give one")
    # The recorded ranks as the run tools read them (nodes, attributes, times).
    strings = run_model.Strings()
    base_ranks = {rank: run_model.Rank.of_nodes(rank, str(path), et.nodes, strings,
                                                host=machines[rank][0], clock=machines[rank][1])
                  for rank, (path, et) in recorded.items()}
    _restore_groups(base_ranks.values(), groups)
    new_world = world if world is not None else recorded_world * (dp or 1)
    if not grow:  # the user's --grow, else the groups the traces describe as data parallel
        grow = sorted((g for g in described if g in groups), key=_group_order)
    plan = make_plan(list(recorded), recorded_world, groups, new_world, grow)
    plan.described = [g for g in grow if g in described]
    notes: list[str] = []
    unplaced = sorted({(p, name) for p in range(recorded_world) for name, members in
                       groups.items() if plan.source[p] in members
                       and plan.group_of.get(p, {}).get(name) is None})
    if unplaced:
        p, name = unplaced[0]
        raise ValueError(f"rank {p}: made from rank {plan.source[p]}, which is in process group "
                         f"{name!r} {groups[name]}; no group of the run holds rank {p} in its "
                         "place, and the group's shifted copies do not partition the run")
    completed = [_made_rank(base_ranks, plan, n) for n in range(recorded_world)]
    groups_before = _groups_before(plan, groups)
    completed_peers = run_peers.analyse(completed, groups_before, recorded_world)
    # Collectives whose peers were not all recorded: their times hold waits for them.
    alone = run_peers.analyse(list(base_ranks.values()), groups, recorded_world)
    unknown = {key for key in alone.unknown if key[0] in base_ranks}
    unknown_of: dict[int, list[int]] = {}  # recorded rank -> those collectives' ids
    for rank, nid in unknown:
        unknown_of.setdefault(rank, []).append(nid)
    fitted = nets.fit_run(completed, completed_peers, groups_before, recorded_world,
                          {(n, nid) for n in range(recorded_world)
                           for nid in unknown_of.get(plan.source[n], ())})
    # Made ranks come from their sources with the lateness the recorded ranks waited for.
    sources = {**base_ranks, **_late_sources(base_ranks, unknown, fitted, strings, notes)}
    ranks = [completed[n] if plan.source[n] == n and n < recorded_world
             else _made_rank(sources, plan, n) for n in range(new_world)]
    links, source, per_host = _new_links(fitted, network_file, new_world)
    if unknown and network_file is None:
        source += " (of collectives whose peers were not recorded, the quickest of each kind)"
    hosts = _hosts(ranks, plan, per_host)
    for r in ranks:
        r.host = hosts.get(r.rank, r.host)
    if per_host is None and fitted.shapes:  # copies of a run on hosts: as many per host
        per_host = fitting.ranks_per_host({r.rank: r.host for r in ranks})
    peers = run_peers.analyse(ranks, plan.groups, new_world)
    transfers = _transfers(ranks, plan, fitted, links, per_host, notes)
    before = whatif.replay_schedule(completed, completed_peers)
    after = whatif.replay_schedule(ranks, peers, transfers)
    recorded_span = max(span_of(r.columns) for r in base_ranks.values())
    notes += [n for n in peers.notes if "keep their recorded time" not in n] + after.notes
    files = _write(out, folder, recorded, plan, ranks, after, peers, links, network_file)
    return Scaled(plan, files, recorded_span, max(before.rank_ends(len(completed)), default=0.0),
                  max(after.rank_ends(len(ranks)), default=0.0), source, notes,
                  {rank: whatif.compute_us(r) for rank, r in sorted(base_ranks.items())})


def _restore_groups(ranks, groups: dict[str, list[int]]) -> None:
    """Groups the astra-sim target simulated over all ranks because their members were not all
    recorded (``pg_ranks_recorded`` on their collectives) given back their members, under a
    name of their own in ``groups`` (changed in place, as the ranks' attributes are)."""
    by_members = {tuple(sorted(m)): name for name, m in groups.items()}
    for r in ranks:
        for nid, node_type, _, _ in r.comm_nodes():
            if node_type != COMM_COLL:
                continue
            a = r.comm[nid]
            if RECORDED_GROUP not in a:
                continue
            members = tuple(sorted(int(m) for m in run_peers.attr_value(a, RECORDED_GROUP)))
            if members not in by_members:
                name = str(max((int(k) for k in groups if k.isdigit()), default=0) + 1)
                groups[name] = list(members)
                by_members[members] = name
            r.comm[nid] = {**a, "pg_name": by_members[members]}


def _groups_before(plan: Plan, groups: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """The recorded run's groups with those the completed ranks see added."""
    out = {k: list(v) for k, v in groups.items()}
    for n in range(plan.recorded_world):
        for name, new in plan.group_of[n].items():
            if new not in out and new in plan.groups and max(plan.groups[new]) < plan.recorded_world:
                out[new] = plan.groups[new]
    return out


def _made_rank(recorded: Mapping[int, run_peers.Rank], plan: Plan, n: int) -> run_peers.Rank:
    """New rank ``n`` as the run tools read it: its source's nodes and times, its own groups
    and peers (attributes of its communication nodes, as plain values)."""
    src = recorded[plan.source[n]]
    comm = dict(src.comm)
    mapping = plan.group_of[n]
    for nid, node_type, _, _ in src.comm_nodes():
        if node_type not in (COMM_COLL, COMM_SEND, COMM_RECV):
            continue
        a = dict(comm[nid])
        if "pg_name" in a:
            name = str(run_peers.attr_value(a, "pg_name"))
            a["pg_name"] = mapping.get(name, name)
        for key in ("comm_src", "comm_dst"):
            if key in a:
                peer = plan.peer(n, int(run_peers.attr_value(a, key)))
                a[key] = -1 if peer is None else peer
        comm[nid] = a
    return run_model.Rank(n, src.path, src.columns, comm, src.host, src.clock, nodes=src.nodes)


LATENESS_NAME = "made_rank_lateness"
LATENESS_ATTR = "lateness_from_wait_of_rank"


def _late_sources(recorded: Mapping[int, run_peers.Rank], unknown: set[run_peers.Key],
                  fitted: nets.RunNetwork, strings: run_model.Strings,
                  notes: list[str]) -> dict[int, run_peers.Rank]:
    """Per recorded rank that waited for peers not recorded, the rank its copies are made
    from: the same nodes, and before each such collective a compute node
    (``made_rank_lateness``) that makes them arrive when the transfer must have begun (its
    end less the network model's time) where no other transfer of the rank was under way
    then to explain that start. That was its wait for the last of its peers; copies
    arriving together would wait for nothing, and a run of one recorded rank would lose its
    waits (the corpus DLRM's rank 0, alone: 0.92 of its span)."""
    out: dict[int, run_peers.Rank] = {}
    count, total = 0, 0.0
    for rank, r in recorded.items():
        extra: dict[int, float] = {}
        c = r.columns
        spans = [(c.starts[p], c.starts[p] + c.durs[p], c.ids[p])
                 for p in whatif.collectives_in_order(c)]
        starts = [s for s, _, _ in spans]  # (in order: collectives_in_order sorts by start)
        ends = sorted(e for _, e, _ in spans)
        zero = Counter(s for s, e, _ in spans if s == e)

        def under_way(t: float) -> int:
            """How many of the rank's transfers were under way at ``t`` (started before it,
            ended after it): one pass of bisections, not a scan of them all per collective."""
            return (bisect.bisect_left(starts, t) - bisect.bisect_right(ends, t)
                    + zero.get(t, 0))

        for start, end, nid in spans:
            found = fitted.samples.get((rank, nid))
            if c.types[r.position(nid)] != COMM_COLL or (rank, nid) not in unknown \
                    or found is None:
                continue
            dim, sample = found
            # When its transfer must have begun, on the model. Where another transfer of the
            # rank was under way then (besides this one), the rank's queue (or their sharing
            # the network) may have held it; where none was, its peers did.
            began = end - fitted.modelled(sample, dim, fitted.shapes.get((rank, nid)),
                                          fitted.links) / 1000
            if began > start and under_way(began) - (began < end) == 0:
                extra[nid] = began - start
        if not extra or r.nodes is None:
            continue
        count, total = count + len(extra), total + sum(extra.values())
        nodes = _with_lateness(r.nodes, extra, rank)
        out[rank] = run_model.Rank.of_nodes(rank, r.path, nodes, strings, host=r.host,
                                            clock=r.clock)
        for nid, a in r.comm.items():  # the groups _restore_groups gave back
            out[rank].comm[nid] = a
    if count:
        notes.append(f"made ranks arrive at {count} collective(s) whose peers were not "
                     f"recorded as late as the recorded rank waited for them ({total / 1000:,.3f}"
                     f" ms in all: '{LATENESS_NAME}' nodes)")
    return out


def _with_lateness(nodes, extra: Mapping[int, float], rank: int) -> list:
    """``nodes`` with a lateness node before each collective in ``extra`` (id -> us): it takes
    the collective's dependencies, and the collective depends on it alone. It is device
    compute, in the rank's order of device compute (after the last that began before the
    collective, before the first that began after it): a late peer was busy, and ASTRA-sim
    runs one device op at a time, so our replay holds it to the same order (as a CPU op it
    would queue behind the host's ops: DLRM from ranks 0 and 7, 1.39x)."""
    from .schema import COMP, Node

    def on_device(node) -> bool:
        return node.type == COMP and not any(
            a.name == "is_cpu_op" and value_of(a) is True for a in node.attr)

    device = sorted((n.start_time_micros, n.id) for n in nodes if on_device(n))
    starts = [t for t, _ in device]
    after: dict[int, list[int]] = {}  # a device node -> the lateness nodes it now follows
    out, added = [], []
    next_id = max((n.id for n in nodes), default=0) + 1
    for node in nodes:
        wait = extra.get(node.id)
        if wait is None:
            out.append(node)
            continue
        late = Node()
        late.id, late.name, late.type = next_id, LATENESS_NAME, COMP
        next_id += 1
        late.data_deps.extend(node.data_deps)
        late.ctrl_deps.extend(node.ctrl_deps)
        deps = set(node.data_deps) | set(node.ctrl_deps)
        at = bisect.bisect_right(starts, node.start_time_micros)
        if at and device[at - 1][1] not in deps:
            late.ctrl_deps.append(device[at - 1][1])
        following = next((device[k][1] for k in range(at, len(device))
                          if device[k][1] not in deps), None)
        if following is not None:
            after.setdefault(following, []).append(late.id)
        late.start_time_micros = node.start_time_micros
        late.duration_micros = round(wait)
        attrs = attr_dict(node)
        late.attr.append(make_attr("is_cpu_op", False))
        for s, d, per_us in _TIMES:
            if s in attrs:
                late.attr.append(make_attr(s, int(value_of(attrs[s]))))
                late.attr.append(make_attr(d, round(wait * per_us)))
        late.attr.append(make_attr(LATENESS_ATTR, rank))
        copy = Node()
        copy.CopyFrom(node)
        del copy.data_deps[:]
        del copy.ctrl_deps[:]
        copy.ctrl_deps.append(late.id)
        out.append(copy)
        added.append(late)
    for i, node in enumerate(out):
        if node.id in after:
            copy = Node()
            copy.CopyFrom(node)
            copy.ctrl_deps.extend(after[node.id])
            out[i] = copy
    return out + added


def _new_links(fitted: nets.RunNetwork, network_file: str | None, world: int
               ) -> tuple[dict[int, nets.Link], str, int | None]:
    """The new run's links per dimension, where they come from, and (a network file of two
    dimensions) how many ranks a host has."""
    if network_file is None:
        return dict(fitted.links), "fitted to the recorded run's transfers", None
    import yaml

    given = nets.read_network_file(network_file, world)
    npus = yaml.safe_load(Path(network_file).read_text())["npus_count"]
    return ({dim: link for dim, link in enumerate(given)},
            f"given in {network_file}, not measured", int(npus[0]) if len(npus) > 1 else None)


def _hosts(ranks: Sequence[run_peers.Rank], plan: Plan, per_host: int | None
           ) -> dict[int, str]:
    """Each new rank's host where the layout says: with a network file of two dimensions,
    hosts of npus_count[0] ranks in rank order; else the copies of a recorded run that spans
    hosts on hosts of their own."""
    if per_host:
        return {r.rank: f"host{r.rank // per_host}" for r in ranks}
    recorded_hosts = {r.host for r in ranks[:plan.recorded_world]}
    if len(recorded_hosts) > 1 and None not in recorded_hosts:
        W = plan.recorded_world
        return {r.rank: r.host if r.rank < W else f"{r.host}+{r.rank // W}" for r in ranks}
    return {}


def _transfers(ranks: Sequence[run_peers.Rank], plan: Plan, fitted: nets.RunNetwork,
               links: Mapping[int, nets.Link], per_host: int | None, notes: list[str]
               ) -> dict[run_peers.Key, float]:
    """Per communication node of the new run that the fit has a sample of, its transfer (us):
    the model's time at the new group size on the new network."""
    W = plan.recorded_world
    out: dict[run_peers.Key, float] = {}
    missing: set[int] = set()
    host_of = {r.rank: r.host for r in ranks}
    # Per group (a thousand members: once, not per node): members, whether they span hosts,
    # and their grid over the hosts.
    seen: dict[object, tuple[list[int], bool, tuple[int, int] | None]] = {}

    def placed(key: object, members: list[int]) -> tuple[list[int], bool, tuple | None]:
        if key not in seen:
            spans = len({host_of.get(m) for m in members}) > 1
            seen[key] = (members, spans,
                         fitting.shape_of(members, per_host) if spans and per_host else None)
        return seen[key]

    def in_group(group: str, rank: int) -> tuple[list[int], bool, tuple | None]:
        members = run_peers.members_of(group, plan.groups, plan.world)
        return placed(group, members) if members else placed((group, rank), [rank])

    for r in ranks:
        p = r.rank % W
        for nid, node_type, _, _ in r.comm_nodes():
            found = fitted.samples.get((p, nid))
            if found is None:
                continue
            dim, old = found
            a = r.comm[nid]
            if node_type == COMM_SEND:
                pair = [r.rank, int(run_peers.attr_value(a, "comm_dst"))]
                members, spans, shape = placed(tuple(pair), pair)
            else:
                group = str(run_peers.attr_value(a, "pg_name")) if "pg_name" in a else ""
                members, spans, shape = seen.get(group) or in_group(group, r.rank)
            npus = len(members)
            new_dim = nets.ACROSS if spans and nets.ACROSS in links else nets.WITHIN
            if new_dim not in links:
                missing.add(new_dim)
            new_links = {d: links.get(d, links[dim]) for d in (nets.WITHIN, nets.ACROSS)}
            new = fitting.Sample(old.comm_type, old.size, npus, old.measured_ns)
            out[(r.rank, nid)] = fitted.modelled(new, new_dim, shape, new_links) / 1000
    for dim in sorted(missing):
        notes.append(f"dimension {dim} ({nets.DIMENSION_NAMES[dim]}) carried none of the "
                     "recorded transfers; its collectives took the recorded dimension's link "
                     "(give --network FILE.yml to say what it is)")
    return out


def _write(out: Path, folder: Path, recorded: Mapping, plan: Plan,
           ranks: Sequence[run_peers.Rank], schedule, peers: run_peers.Peers,
           links: Mapping[int, nets.Link], network_file: str | None) -> list[Path]:
    """The new run's ETs with the replayed times, comm_group.json and, where the conversion
    had them (--target astra-sim), ASTRA-sim's network, system and memory files."""
    files: list[Path] = []
    with storage.replaced_whole(out, "scaling") as staging:
        first_path = next(iter(recorded.values()))[0]
        prefix = etio.name_and_rank(first_path)[0]
        compressed = first_path.name.endswith(".gz")
        per_rank = schedule.per_rank(ranks)
        base = schedule.base
        for index, r in enumerate(ranks):
            _, et = recorded[plan.source[r.rank]]
            name = f"{prefix}.{r.rank}.et" + (".gz" if compressed else "")
            etio.write_et(staging / name, _metadata(et.metadata, plan, r),
                          _retimed(r, per_rank[index], base[index], peers, plan),
                          compress=compressed)
            files.append(out / name)
        if plan.groups:
            etio.atomic_write(staging / run_model.GROUPS_FILE,
                              [orjson.dumps(plan.groups, option=orjson.OPT_INDENT_2)])
            files.append(out / run_model.GROUPS_FILE)
        if (folder / fitting.NETWORK_FILE).exists() or network_file:
            _write_astra_files(staging, folder, plan, links, network_file)
            files += [out / name for name in (fitting.NETWORK_FILE, fitting.SYSTEM_FILE,
                                              fitting.MEMORY_FILE)]
    return files


def _metadata(metadata, plan: Plan, r: run_peers.Rank):
    from .schema import GlobalMetadata

    meta = GlobalMetadata()
    meta.CopyFrom(metadata)
    keep = [a for a in meta.attr if a.name not in ("rank", "world_size", "host", MADE_ATTR,
                                                      SCALED_ATTR)]
    del meta.attr[:]
    meta.attr.extend(keep)
    meta.attr.extend([make_attr("rank", r.rank), make_attr("world_size", plan.world)])
    if r.host is not None:
        meta.attr.append(make_attr("host", r.host))
    if plan.source[r.rank] != r.rank:
        meta.attr.append(make_attr(MADE_ATTR, plan.source[r.rank]))
    if plan.world != plan.recorded_world or plan.made:
        meta.attr.append(make_attr(SCALED_ATTR, plan.recorded_world))
    return meta


_TIMES = (("start_ns", "duration_ns", 1000), ("start_ps", "duration_ps", 1_000_000))


def _retimed(r: run_peers.Rank, replayed: Mapping[int, tuple[float, float, float]],
             base_us: float, peers: run_peers.Peers, plan: Plan):
    """The rank's nodes (copies) with the replayed start, duration and wait for peers, and its
    own groups and peers."""
    from .schema import Node

    first = _first_start(r)
    offset_us = peers.offsets_us.get(r.rank, 0.0)
    starts = r.columns.starts
    for p, node in enumerate(r.nodes):
        copy = Node()
        copy.CopyFrom(node)
        attrs = attr_dict(copy)
        mine = r.comm.get(node.id, attrs) if node.type in COMM_TYPES else attrs
        for key in ("pg_name", "comm_src", "comm_dst"):
            if key in mine and not hasattr(mine[key], "WhichOneof"):
                _set(copy, key, mine[key])
        _drop(copy, RECORDED_GROUP)  # every rank is in the new run: the group is its own
        timed = replayed.get(node.id)
        if timed is not None and starts[p] == starts[p]:
            finish, took, waited = timed
            # From the rank's first start, then on the run's one time base (the clock offset
            # the matching found taken out: the new run's ranks need none).
            start_us = finish - took - base_us - offset_us
            unit = next(((s, d, k) for s, d, k in _TIMES if s in attrs), None)
            if unit is None:
                start = first[0] + round(start_us)
                copy.start_time_micros = start
                copy.duration_micros = round(took)
            else:
                s, d, per_us = unit
                start = first[1] + round(start_us * per_us)
                _set(copy, s, start)
                if d in attrs:
                    _set(copy, d, round(took * per_us))
                copy.start_time_micros = (start + per_us // 2) // per_us
                copy.duration_micros = (round(took * per_us) + per_us // 2) // per_us
            key = (r.rank, node.id)
            if key in peers.wait_us:
                _drop(copy, run_peers.UNKNOWN_ATTR)
                _set(copy, run_peers.WAIT_ATTR, round(waited * 1000))
            elif key in peers.unknown:
                _drop(copy, run_peers.WAIT_ATTR)
                _set(copy, run_peers.UNKNOWN_ATTR, True)
        yield copy


def _first_start(r: run_peers.Rank) -> tuple[int, int]:
    """The rank's first start: (micros, in the finest unit its nodes carry)."""
    micros = fine = None
    starts = r.columns.starts
    for p, node in enumerate(r.nodes):
        if starts[p] != starts[p]:
            continue
        a = attr_dict(node)
        for s, _, _ in _TIMES:
            if s in a:
                value = int(value_of(a[s]))
                fine = value if fine is None else min(fine, value)
                break
        if node.start_time_micros:
            micros = node.start_time_micros if micros is None else min(micros,
                                                                        node.start_time_micros)
    return micros or 0, fine if fine is not None else (micros or 0)


def _set(node, name: str, value) -> None:
    for attr in node.attr:
        if attr.name == name:
            attr.CopyFrom(make_attr(name, value))
            return
    node.attr.append(make_attr(name, value))


def _drop(node, name: str) -> None:
    keep = [a for a in node.attr if a.name != name]
    if len(keep) != len(node.attr):
        del node.attr[:]
        node.attr.extend(keep)


def _write_astra_files(staging: Path, folder: Path, plan: Plan, links: Mapping[int, nets.Link],
                       network_file: str | None) -> None:
    import yaml

    dims = len(links)
    if network_file is not None:
        text = Path(network_file).read_text()
    else:  # the network scale modelled the run on (the conversion's layout), for its NPUs
        where = folder / fitting.NETWORK_FILE
        doc = yaml.safe_load(where.read_text())
        counts = doc.get("npus_count") if isinstance(doc, dict) else None
        if not isinstance(counts, list) or len(counts) not in (1, 2) or (
                len(counts) == 2 and plan.world % counts[0]):
            raise TraceFormatError(where, "npus_count", "one dimension, or two with hosts of "
                                   "npus_count[0] ranks, as convert writes it; for a network of "
                                   "your own, give it with --network")
        dims = len(counts)
        counts = [plan.world] if dims == 1 else [counts[0], plan.world // counts[0]]
        if sorted(links) == list(range(dims)):  # the fit scale used (made ranks' waits apart)
            values = {"bandwidth": [links[d].bandwidth_gbps for d in range(dims)],
                      "latency": [links[d].latency_ns for d in range(dims)]}
        else:
            values = {key: doc[key] for key in ("bandwidth", "latency")}
        listed = {key: ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v)
                                 for v in values[key]) for key in ("bandwidth", "latency")}
        text = (f"# fitted by chakra-hooks to the recorded run of {plan.recorded_world} rank(s), "
                f"for {plan.world} NPUs (chakra-hooks scale); see {fitting.SYSTEM_FILE}\n"
                f"topology: [ {', '.join(doc['topology'])} ]\n"
                f"npus_count: [ {', '.join(str(c) for c in counts)} ]\n"
                f"bandwidth: [ {listed['bandwidth']} ]  # GB/s\n"
                f"latency: [ {listed['latency']} ]  # ns\n")
    (staging / fitting.NETWORK_FILE).write_text(text)
    system = dict(fitting.SYSTEM)
    if (folder / fitting.SYSTEM_FILE).exists():
        system = orjson.loads((folder / fitting.SYSTEM_FILE).read_bytes())
    for key, value in list(system.items()):
        if key.endswith("-implementation") and isinstance(value, list) and value:
            system[key] = [value[0]] * dims
    (staging / fitting.SYSTEM_FILE).write_bytes(orjson.dumps(system, option=orjson.OPT_INDENT_2))
    (staging / fitting.MEMORY_FILE).write_bytes(orjson.dumps(fitting.MEMORY))


def render(done: Scaled, folder: Path, out: Path) -> str:
    """What ``scale`` prints: where each rank came from, the groups that grew, the network, the
    spans, notes, and the commands to run next (absolute paths: they work from any folder)."""
    plan = done.plan
    made = plan.made
    lines = [f"{plan.world} rank(s) from a run of {plan.recorded_world} recorded on "
             f"{_ranges(plan.recorded)}; made: {_made(plan)}"]
    if plan.world > plan.recorded_world:
        lines.append("process groups grown across the copies: " + (
            ", ".join(repr(g) for g in plan.grown) if plan.grown else "the whole run's")
            + (f" ({', '.join(repr(g) for g in plan.described)}: described as data parallel "
               "in the traces)" if plan.described else "")
            + "; the others copied with their copy")
    if made:
        lines.append("made ranks are copies: each computes as its source did; " + _spread(done))
    lines.append(f"network: {done.network}")
    lines.append(f"recorded span {done.recorded_span_us / 1e3:,.3f} ms, replayed "
                 f"{done.replayed_us / 1e3:,.3f} ms; the new run replays in "
                 f"{done.predicted_us / 1e3:,.3f} ms ({_change(done)})")
    lines += [f"  note: {n}" for n in done.notes]
    here = out.resolve()
    lines.append(f"wrote {len(done.files)} file(s) to {out}")
    prefix = etio.name_and_rank(done.files[0])[0] if done.files else "chakra"
    groups = here / run_model.GROUPS_FILE
    astra = (" | ASTRA-sim: " + fitting.command(here, prefix, groups if groups.exists() else None)
             if (here / fitting.NETWORK_FILE).exists() else "")
    lines.append(f"next: chakra-hooks stats {here} | chakra-hooks whatif {here} --bandwidth 2x"
                 + astra)
    return "\n".join(lines)


def _made(plan: Plan) -> str:
    """Which ranks were made from which: per source, or for copies of a whole recorded run in
    one phrase."""
    made = plan.made
    if not made:
        return "none"
    W = plan.recorded_world
    if plan.recorded == list(range(W)):
        return f"{_ranges(made)}, copies of the recorded run (rank n from rank n mod {W})"
    by_source = [f"{_ranges(sorted(n for n in made if plan.source[n] == r))} from rank {r}"
                 for r in sorted({plan.source[n] for n in made})]
    return ", ".join(by_source[:8]) + (f", ... ({len(by_source)} recorded ranks in all)"
                                       if len(by_source) > 8 else "")


def _spread(done: Scaled) -> str:
    """How far the recorded ranks' compute spread: what the copies stand for."""
    compute = done.compute_us
    if len(compute) < 2:
        return ("one rank recorded: how far the others' compute spread is not known (ranks "
                "that shard their work, such as embedding tables, differ)")
    low, high = min(compute, key=compute.get), max(compute, key=compute.get)
    middle = sorted(compute.values())[(len(compute) - 1) // 2]
    return (f"the recorded ranks' compute spread from {compute[low] / 1e3:,.3f} ms (rank {low}) "
            f"to {compute[high] / 1e3:,.3f} ms (rank {high}), median {middle / 1e3:,.3f}")


def _change(done: Scaled) -> str:
    if not done.replayed_us:
        return "nothing replayed"
    return f"{done.predicted_us / done.replayed_us - 1:+.1%} against the recorded run's replay"


def _ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2, 5'."""
    return ("rank " if len(ranks) == 1 else "ranks ") + run_peers.listed(ranks)
