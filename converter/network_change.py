"""``whatif --bandwidth / --latency / --network``: a change of the network, applied through a
model of it fitted to the run's own transfers, not a flat factor on communication.

A collective's transfer (its time after the last member arrived, converter/peers.py) is, on
the model, latency terms plus bytes over bandwidth (converter/targets/astra_sim/network.py:
the formulas ASTRA-sim's analytical backend follows, per collective type and group size). A
network twice as fast halves only the bandwidth term, so a latency-bound collective barely
moves where ``--comm 0.5x`` would halve it. Each collective's transfer is scaled by the model's
time on the new network over its time on the fitted one: what the model does not explain
(noise, one collective slower than its size says) is kept in proportion.

Dimensions, as ASTRA-sim numbers them: 0, the links within a host; 1, the links between hosts
(where the recording names each rank's host: ``host`` in the ETs' metadata). A collective whose
members all share a host is fitted and changed on dimension 0. Where the ranks sit on hosts of
as many ranks each in rank order (as ASTRA-sim lays NPUs out over two dimensions), one that
spans hosts is modelled as ASTRA-sim runs it over both (network.py, ``modelled_2d_ns``:
reduce-scatter within the host, all-reduce between hosts on its share, all-gather within, in
pipelined chunks), dimension 1 fitted through that model with dimension 0 as fitted; other
layouts take it as a ring over all its members whose slowest link bounds it (gloo's and
NCCL's rings cross each host's uplink), so that a faster dimension 1 speeds it up until
dimension 0 bounds it. A run on one host, or with no host recorded, has dimension 0 only.

The fit is the one ``convert --target astra-sim`` writes (the same samples: each collective's
transfer, collectives that overlapped sharing the time they covered): ``whatif --bandwidth 4x``
and ASTRA-sim on the fitted network with its bandwidth times 4 model the same network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chakra_hooks.common.errors import TraceFormatError

from .peers import Key, Peers, Rank, attr_value, members_of
from .schema import COMM_COLL, COMM_SEND
from .targets.astra_sim import network as fitting

WITHIN, ACROSS = 0, 1
DIMENSION_NAMES = {WITHIN: "within a host", ACROSS: "between hosts"}


@dataclass(frozen=True)
class Link:
    """One dimension's bandwidth (GB/s, ASTRA-sim's) and latency (ns)."""

    bandwidth_gbps: float
    latency_ns: float


@dataclass(frozen=True)
class NetworkChange:
    """Per dimension (None: every dimension), a factor on bandwidth, and on latency either a
    factor or a new value (ns); or a whole network (``links`` per dimension, from a file)."""

    bandwidth: Mapping[int | None, float] = field(default_factory=dict)
    latency: Mapping[int | None, tuple[str, float]] = field(default_factory=dict)
    links: tuple[Link, ...] | None = None
    source: str = ""

    def __bool__(self) -> bool:
        return bool(self.bandwidth or self.latency or self.links)

    def describe(self) -> str:
        if self.links is not None:
            return f"the network of {self.source}"
        parts = []
        for dim, factor in self.bandwidth.items():
            parts.append(f"bandwidth x{factor:g}" + _on(dim))
        for dim, (how, value) in self.latency.items():
            parts.append((f"latency x{value:g}" if how == "x" else f"latency {value:g} ns")
                         + _on(dim))
        return ", ".join(parts)

    def apply(self, dim: int, link: Link) -> Link:
        if self.links is not None:
            return self.links[min(dim, len(self.links) - 1)]
        bandwidth = link.bandwidth_gbps * self.bandwidth.get(dim, self.bandwidth.get(None, 1.0))
        how, value = self.latency.get(dim, self.latency.get(None, ("x", 1.0)))
        latency = link.latency_ns * value if how == "x" else value
        return Link(bandwidth, latency)


def _on(dim: int | None) -> str:
    return "" if dim is None else f" on dimension {dim} ({DIMENSION_NAMES.get(dim, '?')})"


@dataclass
class RunNetwork:
    """The network fitted to a run: per dimension its link and how many collectives it was
    fitted to; per communication node (rank, id), its dimension and model sample."""

    links: dict[int, Link]
    fitted_to: dict[int, int]
    samples: dict[Key, tuple[int, fitting.Sample]]
    hosts: int
    unsplit: tuple[int, ...] = ()  # dimensions whose fit could not tell latency from bandwidth
    # Hosts of as many ranks each, in rank order: per collective between hosts, its group's
    # shape (ranks per host, hosts), modelled as ASTRA-sim runs it over two dimensions.
    shapes: dict[Key, tuple[int, int]] = field(default_factory=dict)

    def modelled(self, sample: fitting.Sample, dim: int, shape: tuple[int, int] | None,
                 links: Mapping[int, Link]) -> float:
        """The model's time (ns) for ``sample`` on ``links``: over two dimensions where it has
        a shape spanning hosts and both links are there, else on its dimension's link."""
        if shape is not None and shape[1] > 1 and WITHIN in links and ACROSS in links:
            return fitting.modelled_2d_ns(sample, shape, tuple(
                (links[d].bandwidth_gbps, links[d].latency_ns) for d in (WITHIN, ACROSS)))
        link = links[dim]
        return fitting.modelled_ns(sample, link.bandwidth_gbps, link.latency_ns)

    def factors(self, change: NetworkChange) -> tuple[dict[Key, float], list[str]]:
        """Per communication node, its transfer's factor under ``change``, and notes."""
        notes = []
        new = {dim: change.apply(dim, link) for dim, link in self.links.items()}
        unknown = sorted(d for d in (*change.bandwidth, *change.latency)
                         if d is not None and not self.fitted_to.get(d))
        for dim in self.unsplit:
            if change.links is not None or None in change.bandwidth or dim in change.bandwidth:
                notes.append(f"dimension {dim}: larger transfers were not slower in this "
                             "recording, so it does not tell latency from bandwidth; bandwidth "
                             "was given all but 500 ns of latency, and a bandwidth change moves "
                             "these transfers as far as it could")
        if unknown:
            notes.append(f"dimension {unknown[0]} ({DIMENSION_NAMES[unknown[0]]}) carried "
                         "none of the recorded transfers: changing it moves nothing")
        if change.links is not None and len(change.links) < 2 and len(self.links) > 1:
            notes.append(f"{change.source} has one dimension: it stands for the links within "
                         "and between hosts alike")
        bounded = 0
        out: dict[Key, float] = {}
        for key, (dim, sample) in self.samples.items():
            shape = self.shapes.get(key)
            if shape is not None:  # over two dimensions, as ASTRA-sim runs it
                before = self.modelled(sample, dim, shape, self.links)
                if before > 0:
                    out[key] = self.modelled(sample, dim, shape, new) / before
                continue
            old = self.links[dim]
            link = new[dim]
            if (dim == ACROSS and WITHIN in new and WITHIN not in self.unsplit
                    and new[WITHIN].bandwidth_gbps < link.bandwidth_gbps):
                # The ring's slowest link, where the recording told dimension 0's bandwidth
                # apart (a fit that gave it all the time says nothing of its links' rate).
                link = Link(new[WITHIN].bandwidth_gbps, link.latency_ns)
                bounded += 1
            before = fitting.modelled_ns(sample, old.bandwidth_gbps, old.latency_ns)
            after = fitting.modelled_ns(sample, link.bandwidth_gbps, link.latency_ns)
            if before > 0:
                out[key] = after / before
        if bounded:
            notes.append(f"{bounded} collective(s) between hosts are bounded by the links within "
                         "a host on the new network")
        return out, notes

    def to_json(self) -> dict:
        return {str(dim): {"bandwidth_gbps": float(f"{link.bandwidth_gbps:.6g}"),
                           "latency_ns": round(link.latency_ns, 3),
                           "transfers": self.fitted_to[dim]}
                for dim, link in sorted(self.links.items())}

    def describe(self) -> list[str]:
        lines = []
        for dim, link in sorted(self.links.items()):
            if not self.fitted_to[dim] and self.shapes:
                lines.append(f"dimension {dim} ({DIMENSION_NAMES[dim]}): no transfer stayed "
                             "on it alone, so it was never the bottleneck here (modelled as "
                             "never one)")
                continue
            lines.append(f"dimension {dim} ({DIMENSION_NAMES[dim]}): "
                         f"{link.bandwidth_gbps:.6g} GB/s, latency {link.latency_ns:,.0f} ns, "
                         f"fitted to {self.fitted_to[dim]:,} transfer(s) (each one member's "
                         f"in one collective)")
        if self.shapes:
            lines.append(f"{len(self.shapes):,} transfer(s) between hosts modelled over both "
                         "dimensions as ASTRA-sim runs them")
        return lines


def fit_run(ranks: Sequence[Rank], peers: Peers, groups: Mapping[str, Sequence[int]],
            world: int, waits_unknown: frozenset[Key] | set[Key] = frozenset()) -> RunNetwork:
    """``RunNetwork`` for a run's ranks (decoded ETs) and what peers.analyse found.
    ``waits_unknown``: communication nodes whose time holds an unknown wait for peers beside
    the transfer (their peers were not recorded); of each kind of them (type, size, group
    size), only the quickest is fitted to, a transfer being no longer than any of its times
    (``scale``, which gives made ranks the rest as lateness)."""
    from .targets.astra_sim.run_rules import one_at_a_time

    host_of = {r.rank: r.host for r in ranks}
    hosts = {h for h in host_of.values() if h is not None}
    split_hosts = len(hosts) > 1 and None not in host_of.values()
    per_host = fitting.ranks_per_host(host_of) if split_hosts and len(ranks) == world else None
    shapes: dict[Key, tuple[int, int]] = {}
    transfer = one_at_a_time({r.rank: r.comm_nodes() for r in ranks}, peers.transfer_us)
    receiver = {c[0]: c[1][0] for c in peers.columns if len(c) == 2}  # a send's peer
    # Every member of a collective counts it at the largest member's size, as the astra-sim
    # target writes it (run_rules.harmonize: uneven all-to-all sizes).
    by_rank = {r.rank: r for r in ranks}
    largest: dict[Key, int] = {}
    for column in peers.columns:
        attrs = [by_rank[rank].comm[nid] for rank, nid in column]
        if len(column) > 1 and all("comm_size" in a for a in attrs):
            top = max(int(attr_value(a, "comm_size")) for a in attrs)
            largest.update(dict.fromkeys(column, top))
    samples: dict[Key, tuple[int, fitting.Sample]] = {}
    for r in ranks:
        for nid, node_type, _, _ in r.comm_nodes():
            key = (r.rank, nid)
            if node_type not in (COMM_COLL, COMM_SEND) or key not in transfer:
                continue
            if node_type == COMM_SEND and key not in peers.transfer_us:
                continue  # a send whose receive is not here
            a = r.comm[nid]
            if "comm_size" not in a:
                continue
            size = largest.get(key) or int(attr_value(a, "comm_size"))
            if node_type == COMM_SEND:
                members = [r.rank, receiver.get(key, r.rank)]
                sample = fitting.Sample(fitting.POINT_TO_POINT, size, 2, transfer[key] * 1000)
            else:
                group = str(attr_value(a, "pg_name")) if "pg_name" in a else ""
                members = members_of(group, groups, world) or []
                sample = fitting.Sample(int(attr_value(a, "comm_type")), size,
                                        len(members) or world, transfer[key] * 1000)
            across = split_hosts and len({host_of.get(m) for m in members}) > 1
            samples[key] = (ACROSS if across else WITHIN, sample)
            if across and per_host:
                shapes[key] = fitting.shape_of(members, per_host)
    fitted_samples = samples
    if waits_unknown:
        # Of each kind, the quickest; but a kind of which some overlapped others is fitted as
        # the rest are (a share of the time they covered together says less than a transfer:
        # DDP's buckets, two at a time, made whole at 0.81 of the span fitted to their least).
        kind_of = {key: (dim, sample.comm_type, sample.size, sample.npus, shapes.get(key))
                   for key, (dim, sample) in samples.items() if key in waits_unknown}
        quickest: dict[tuple, Key] = {}
        overlapped: set[tuple] = set()
        for key, kind in kind_of.items():
            if transfer[key] < peers.transfer_us.get(key, transfer[key]) * (1 - 1e-6):
                overlapped.add(kind)
            elif kind not in quickest or (samples[key][1].measured_ns
                                          < samples[quickest[kind]][1].measured_ns):
                quickest[kind] = key
        kept = set(quickest.values())
        fitted_samples = {key: found for key, found in samples.items()
                          if key not in kind_of or key in kept or kind_of[key] in overlapped}
    links, fitted_to, unsplit = {}, {}, []
    if shapes:  # hosts of as many ranks each: two dimensions, as ASTRA-sim models them
        inner, outer = fitting.fit_two_dims(
            [s for key, (d, s) in fitted_samples.items() if d == WITHIN],
            [(s, shapes[key]) for key, (d, s) in fitted_samples.items() if d == ACROSS])
        for dim, fitted in ((WITHIN, inner), (ACROSS, outer)):
            links[dim] = Link(fitted.bandwidth_gbps, fitted.latency_ns)
            fitted_to[dim] = fitted.collectives
            if fitted.collectives and not fitted.split:
                unsplit.append(dim)
        return RunNetwork(links, fitted_to, samples, len(hosts), tuple(unsplit), shapes)
    for dim in (WITHIN, ACROSS):
        mine = [s for d, s in fitted_samples.values() if d == dim]
        if mine or (dim == WITHIN and not samples):
            fitted = fitting.fit(mine)
            links[dim] = Link(fitted.bandwidth_gbps, fitted.latency_ns)
            fitted_to[dim] = fitted.collectives
            if fitted.collectives and not fitted.split:
                unsplit.append(dim)
    return RunNetwork(links, fitted_to, samples, len(hosts) if split_hosts else 1,
                      tuple(unsplit))


def parse_dimension_values(flag: str, items: Sequence[str], absolute: bool
                           ) -> dict[int | None, tuple[str, float]]:
    """'2x' (every dimension) or '1=2x' (dimension 1); with ``absolute``, also a latency such
    as '2us' or '500ns' (a new value, not a factor)."""
    from .whatif import parse_factor

    out: dict[int | None, tuple[str, float]] = {}
    for item in items:
        dim: int | None = None
        value = item
        if "=" in item:
            name, _, value = item.partition("=")
            if not name.strip().isdigit() or int(name) not in DIMENSION_NAMES:
                raise ValueError(f"{flag} {item!r}: dimension {name!r} is not 0 (within a host) "
                                 f"or 1 (between hosts)")
            dim = int(name)
        text = value.strip().lower()
        units = {"ns": 1.0, "us": 1e3, "ms": 1e6}
        if absolute and text[-2:] in units:
            try:
                out[dim] = ("=", float(text[:-2]) * units[text[-2:]])
            except ValueError:
                raise ValueError(f"{flag} {item!r}: expected a factor such as 2x or a "
                                 f"latency such as 5us") from None
            if out[dim][1] < 0:
                raise ValueError(f"{flag} {item!r}: a latency cannot be negative")
            continue
        factor = parse_factor(value)
        if factor <= 0 and not absolute:
            raise ValueError(f"{flag} {item!r}: a bandwidth factor must be above 0")
        out[dim] = ("x", factor)
    return out


def read_network_file(path: str | Path, npus: int) -> tuple[Link, ...]:
    """The links of an ASTRA-sim network file (``topology``, ``npus_count``, ``bandwidth`` in
    GB/s, ``latency`` in ns, one entry per dimension), checked against the run's ``npus``."""
    import yaml

    where = Path(path)
    try:
        doc = yaml.safe_load(where.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TraceFormatError(where, "file", f"an ASTRA-sim network (YAML): {exc}") from None
    if not isinstance(doc, dict):
        raise TraceFormatError(where, "file", "an ASTRA-sim network: a mapping with "
                               "topology, npus_count, bandwidth and latency")
    lists = {}
    for key in ("npus_count", "bandwidth", "latency"):
        value = doc.get(key)
        if not isinstance(value, list) or not value or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value):
            raise TraceFormatError(where, key, "a list of non-negative numbers, one per "
                                   "dimension")
        lists[key] = value
    if len({len(v) for v in lists.values()}) > 1:
        raise TraceFormatError(where, "npus_count", "as many entries as bandwidth and latency")
    if len(lists["npus_count"]) > 2:
        raise TraceFormatError(where, "npus_count", "one or two dimensions (within and between "
                               "hosts)")
    total = 1
    for n in lists["npus_count"]:
        total *= int(n)
    if total != npus:
        raise TraceFormatError(where, "npus_count", f"{npus} NPUs in all, one per rank of the "
                               f"run, got {' x '.join(str(n) for n in lists['npus_count'])} = "
                               f"{total}")
    if any(b <= 0 for b in lists["bandwidth"]):
        raise TraceFormatError(where, "bandwidth", "bandwidths above 0 GB/s")
    return tuple(Link(float(b), float(lat)) for b, lat in zip(lists["bandwidth"],
                                                             lists["latency"]))
