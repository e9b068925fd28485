"""An ASTRA-sim network fitted to the collectives a run measured (``convert --target astra-sim``).

ASTRA-sim's analytical backend (congestion unaware) times each collective from the links'
bandwidth and latency, not from the trace. So that a simulation of the run takes as long as
the run did, ``convert`` writes ``astra_network.yml`` (a ring of the run's NPUs, bandwidth and
latency fitted here; where the run's ranks sit on hosts of as many ranks each, two rings, one
within a host and one between hosts, ``fit_two_dims``) and ``astra_system.json`` (the system layer the fit assumes: ring
algorithms, 4 dataset splits, one active chunk, local memory 1,600 GB/s); changing the one
bandwidth or latency number is then a what-if.

The collective times this fit assumes were measured with ASTRA-sim's binary (one collective
of S bytes over a ring of N NPUs, at two bandwidths, two latencies and two sizes; exact to the
nanosecond for N = 2, 4, 8, docs/model-time.md):

    T = L(N) * latency + S * B(N) / bandwidth + S * R(N)   (ns; bandwidth in GB/s as ASTRA-sim
                                                            reads it: 2^30 bytes per second)

- ALL_REDUCE: L = 8 (N-1), B = 2 (N-1) / N, R = 3 (N-1) / (N * 1600) (the reduction);
- REDUCE_SCATTER: L = 4 (N-1), B = (N-1) / N, R = 3 (N-1) / (N * 1600);
- ALL_GATHER: L = 4 (N-1), B = N - 1 (comm_size is each rank's part);
- ALL_TO_ALL: L = 2 N (N-1), B = (N-1) / 2;
- a send and its receive (point to point): L = 1, B = 1 (measured at 1 and 16 MiB, 50 and
  100 GB/s, 0 and 1,000 ns: exact).

The fit: least squares over every measured collective of every rank for the split between
latency and bandwidth, then both scaled so that the modelled collectives add up to the
measured total exactly. Where larger collectives were not slower (no split with a positive
bandwidth), or only two sizes were measured and too noisily to split (``MAX_SPLIT_ERROR``), the
latency is 500 ns and the bandwidth takes the rest, so that a bandwidth
what-if still moves the collectives. A collective's measured time includes waiting for its slowest peer;
ASTRA-sim models that wait itself, so on runs whose ranks are skewed the fitted network is
slower than the real one (a simulated run still ends where the measured one did).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from chakra_hooks.linker.model import CommType

GIB_PER_GB = 2**30 / 1e9  # ASTRA-sim turns GB/s into bytes per ns with 2^30
LOCAL_MEM_GBPS = 1600.0
SYSTEM = {
    "scheduling-policy": "LIFO",
    "endpoint-delay": 10,
    "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 4,
    "all-reduce-implementation": ["ring"],
    "all-gather-implementation": ["ring"],
    "reduce-scatter-implementation": ["ring"],
    "all-to-all-implementation": ["ring"],
    "collective-optimization": "localBWAware",
    "local-mem-bw": LOCAL_MEM_GBPS,
    "boost-mode": 0,
    "roofline-enabled": 0,
    "peak-perf": 900,
}
NETWORK_FILE, SYSTEM_FILE = "astra_network.yml", "astra_system.json"
# The remote memory ASTRA-sim's binary requires a file for (none: every run here keeps its
# tensors local).
MEMORY_FILE, MEMORY = "astra_memory.json", {"memory-type": "NO_MEMORY_EXPANSION"}
BINARY = "AstraSim_Analytical_Congestion_Unaware"  # the analytical backend these files suit


def command(folder: object, prefix: str, groups: object = None) -> str:
    """The ASTRA-sim command line that runs the ETs ``<folder>/<prefix>.<npu>.et`` with the
    files written beside them (and ``groups``, a comm_group.json). Give ``folder`` absolute,
    so that it runs from any folder."""
    network = f"{folder}/{NETWORK_FILE}"
    return (f"{BINARY} --workload-configuration={folder}/{prefix} "
            f"--network-configuration={network} "
            f"--system-configuration={folder}/{SYSTEM_FILE} "
            f"--remote-memory-configuration={folder}/{MEMORY_FILE}"
            + (f" --comm-group-configuration={groups}" if groups else ""))
FAST_GBPS = 1e6  # a network that is never the bottleneck, where nothing is left to fit
POINT_TO_POINT = -1  # Sample.comm_type of a send and its receive (no CollectiveCommType)
DEFAULT_GBPS, DEFAULT_NS = 50.0, 500.0  # astra-run's defaults, where nothing was measured
# Collectives of only two sizes are fitted exactly through both, whatever their noise: there
# the latency / bandwidth split is kept only where the repeated measurements pin it down (the
# fitted inverse bandwidth's standard error at most this share of it). Otherwise bandwidth
# alone takes what a 500 ns latency leaves (gloo all-reduces of 1 MB took 0.6 or 5.6 ms from
# one step to the next on a 2-core machine, and the split swung the fitted bandwidth 4x
# between recordings of one program).
MAX_SPLIT_ERROR = 0.10


@dataclass(frozen=True)
class Sample:
    """One measured collective: its type, bytes, group size and measured time (ns)."""

    comm_type: int
    size: int
    npus: int
    measured_ns: float


@dataclass(frozen=True)
class Network:
    bandwidth_gbps: float
    latency_ns: float
    collectives: int  # how many were fitted
    measured_ns: float  # their measured total
    modelled_ns: float  # what the fitted network gives them
    split: bool = True  # latency and bandwidth told apart by the fit (else bandwidth takes all)

    def yaml(self, npus: int) -> str:
        return (f"# fitted by chakra-hooks to {self.collectives} measured collectives "
                f"({self.measured_ns / 1e6:,.3f} ms in all); see {SYSTEM_FILE}\n"
                f"topology: [ Ring ]\nnpus_count: [ {npus} ]\n"
                f"bandwidth: [ {self.bandwidth_gbps:.6g} ]  # GB/s\n"
                f"latency: [ {self.latency_ns:.6g} ]  # ns\n")


def two_dims_yaml(inner: Network, outer: Network, per_host: int, hosts: int) -> str:
    """ASTRA-sim's network of ``hosts`` hosts of ``per_host`` NPUs, fitted per dimension."""
    measured = inner.measured_ns + outer.measured_ns
    told = "" if inner.collectives else (" (no collective stayed within a host: dimension 0 "
                                         "was never measured, and never the bottleneck here)")
    return (f"# fitted by chakra-hooks to {inner.collectives + outer.collectives} measured "
            f"collectives ({measured / 1e6:,.3f} ms in all): dimension 0 within a host, 1 "
            f"between hosts{told}; see {SYSTEM_FILE}\n"
            f"topology: [ Ring, Ring ]\nnpus_count: [ {per_host}, {hosts} ]\n"
            f"bandwidth: [ {inner.bandwidth_gbps:.6g}, {outer.bandwidth_gbps:.6g} ]  # GB/s\n"
            f"latency: [ {inner.latency_ns:.6g}, {outer.latency_ns:.6g} ]  # ns\n")


def coefficients(comm_type: int, n: int) -> tuple[float, float, float] | None:
    """(L, B, R) of the model above, or None for a type ASTRA-sim does not simulate."""
    if n < 2:
        return None
    if comm_type == POINT_TO_POINT:
        return 1, 1.0, 0.0
    share = (n - 1) / n
    reduce = 3 * share / LOCAL_MEM_GBPS
    if comm_type == CommType.ALL_REDUCE:
        return 8 * (n - 1), 2 * share, reduce
    if comm_type == CommType.REDUCE_SCATTER:
        return 4 * (n - 1), share, reduce
    if comm_type == CommType.ALL_GATHER:
        return 4 * (n - 1), n - 1, 0.0
    if comm_type == CommType.ALL_TO_ALL:
        return 2 * n * (n - 1), (n - 1) / 2, 0.0
    return None


def modelled_ns(sample: Sample, bandwidth_gbps: float, latency_ns: float) -> float:
    coeff = coefficients(sample.comm_type, sample.npus)
    if coeff is None:
        return 0.0
    lat, per_byte, reduce = coeff
    return (lat * latency_ns + sample.size * per_byte / (bandwidth_gbps * GIB_PER_GB)
            + sample.size * reduce)


def fit(samples: Iterable[Sample]) -> Network:
    """Latency and bandwidth that make the modelled collectives add up to the measured ones."""
    samples = list(samples)
    rows = []  # (latency coefficient, inverse-bandwidth coefficient, time left to explain)
    for s in samples:
        coeff = coefficients(s.comm_type, s.npus)
        if coeff is None or s.size <= 0:
            continue
        lat, per_byte, reduce = coeff
        rows.append((lat, s.size * per_byte / GIB_PER_GB, s.measured_ns - s.size * reduce))
    if not rows:
        return Network(DEFAULT_GBPS, DEFAULT_NS, 0, 0.0, 0.0)
    measured = sum(t for _, _, t in rows)
    lat_total = sum(a for a, _, _ in rows)
    byte_total = sum(b for _, b, _ in rows)
    if measured <= 0 or byte_total <= 0:  # nothing left for the network to explain
        return Network(FAST_GBPS, 0.0, len(rows), measured, 0.0)
    x_lat, x_inv = _least_squares(_medians(rows))
    sizes = {(s.comm_type, s.size, s.npus) for s in samples
             if s.size > 0 and coefficients(s.comm_type, s.npus)}
    if len(sizes) < 3 and x_inv > 0 and _relative_error(rows, x_lat, x_inv) > MAX_SPLIT_ERROR:
        x_lat, x_inv = 0.0, 0.0  # two sizes, too noisy for a split: see MAX_SPLIT_ERROR
    split = x_inv > 0
    if not split:
        # Larger collectives were not slower (waits for peers dominate): bandwidth alone takes
        # what a 500 ns link latency leaves, so that a bandwidth what-if still moves them.
        x_lat = min(DEFAULT_NS, 0.5 * measured / lat_total)
        x_inv = (measured - x_lat * lat_total) / byte_total
    else:
        scale = measured / (x_lat * lat_total + x_inv * byte_total)  # totals agree exactly
        x_lat, x_inv = x_lat * scale, x_inv * scale
    return Network(1 / x_inv, x_lat, len(rows), measured, measured, split)


def _relative_error(rows: list[tuple[float, float, float]], x_lat: float, x_inv: float) -> float:
    """The standard error of the fitted inverse bandwidth over its value, from the residuals
    (ordinary least squares; infinite where nothing is left to estimate it from)."""
    if len(rows) <= 2:
        return float("inf")  # an exact fit: nothing says how noisy
    saa = sum(a * a for a, _, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    det = saa * sbb - sab * sab
    if det <= 0:
        return float("inf")
    residual = sum((t - a * x_lat - b * x_inv) ** 2 for a, b, t in rows) / (len(rows) - 2)
    return (residual * saa / det) ** 0.5 / x_inv


def _medians(rows: list[tuple[float, float, float]]) -> list[tuple[float, float, float, int]]:
    """One row per kind of collective (type, size, group size): its coefficients, the median
    of its times and how many there were. A few collectives stalled by the host (gloo's
    hand-offs on a loaded machine: 64 KB all-reduces of 1.5 to 4.4 ms in one recording) then
    move the split no more than their share, where least squares over every sample gave
    them the latency (534 us where the medians say none, three times too much at four ranks)."""
    import statistics

    kinds: dict[tuple[float, float], list[float]] = {}
    for a, b, t in rows:  # (the same coefficients: the same collective to the model)
        kinds.setdefault((a, b), []).append(t)
    return [(a, b, statistics.median(ts), len(ts)) for (a, b), ts in kinds.items()]


def _least_squares(rows: list[tuple[float, float, float, int]]) -> tuple[float, float]:
    """Weighted least squares in two unknowns (latency ns, inverse bandwidth) over rows of
    (coefficients, time, weight); (0, 0) where no solution has both non-negative."""
    saa = sum(w * a * a for a, _, _, w in rows)
    sbb = sum(w * b * b for _, b, _, w in rows)
    sab = sum(w * a * b for a, b, _, w in rows)
    sat = sum(w * a * t for a, _, t, w in rows)
    sbt = sum(w * b * t for _, b, t, w in rows)
    det = saa * sbb - sab * sab
    if det > 1e-9 * saa * sbb:
        x_lat, x_inv = (sat * sbb - sbt * sab) / det, (sbt * saa - sat * sab) / det
        if x_lat >= 0 and x_inv > 0:
            return x_lat, x_inv
    return 0.0, 0.0


# ------------------------------------------------------------------ two dimensions
# ASTRA-sim's collectives over two dimensions (Ring x Ring; NPU n at place n mod G of host
# n // G, dimension 0 within a host): each of the 4 chunks goes through phases, one dimension
# each, and a dimension works on one chunk at a time. Measured on the binary (1 and 16 MiB,
# 2 x 2, 4 x 2 and 2 x 4 NPUs, 10 / 100 GB/s, 0 / 1,000 ns on either dimension): within 1.7 %
# for all four types, with
#   ALL_REDUCE: reduce-scatter within the host, all-reduce between hosts on its 1 / G,
#               all-gather within the host;
#   ALL_GATHER: all-gather between hosts, then within the host on H times the part;
#   REDUCE_SCATTER: reduce-scatter within, then between on its 1 / G;
#   ALL_TO_ALL: all-to-all within, then between, on the whole chunk each;
# and the collective takes, over the dimensions, the longest of: the phases before that
# dimension's first for one chunk, its own phases for all 4, the phases after its last for one.
# A group with one rank per host runs on dimension 1 alone, one within a host on dimension 0
# (measured: a group {0, 2} of 2 x 2 NPUs all-reduces at dimension 1's rate).
CHUNKS = 4


def _phase_ns(kind: str, n: int, chunk: float, bandwidth_gbps: float, latency_ns: float
              ) -> float:
    """One chunk's phase on a ring of ``n`` (the per-chunk terms of ``coefficients``)."""
    if n < 2:
        return 0.0
    share = (n - 1) / n
    per_byte = 1 / (bandwidth_gbps * GIB_PER_GB)
    if kind == "RS":
        return (n - 1) * latency_ns + chunk * share * per_byte + chunk * 3 * share / LOCAL_MEM_GBPS
    if kind == "AG":  # ``chunk``: each rank's part
        return (n - 1) * latency_ns + chunk * (n - 1) * per_byte
    if kind == "AR":
        return (2 * (n - 1) * latency_ns + chunk * 2 * share * per_byte
                + chunk * 3 * share / LOCAL_MEM_GBPS)
    return n * (n - 1) / 2 * latency_ns + chunk * (n - 1) / 2 * per_byte  # all-to-all


def modelled_2d_ns(sample: Sample, shape: tuple[int, int],
                   links: Sequence[tuple[float, float]]) -> float:
    """ASTRA-sim's time for ``sample`` over a group of ``shape`` (ranks per host G, hosts H)
    on two dimensions, ``links`` = ((bandwidth GB/s, latency ns) within, between)."""
    per_host, hosts = shape
    if hosts < 2 or per_host < 2:  # one dimension
        dim = 0 if hosts < 2 else 1
        one = Sample(sample.comm_type, sample.size, per_host if dim == 0 else hosts,
                     sample.measured_ns)
        return modelled_ns(one, *links[dim])
    (bw0, lat0), (bw1, lat1) = links
    chunk, kind = sample.size / CHUNKS, sample.comm_type
    if kind == POINT_TO_POINT:
        return modelled_ns(sample, bw1, lat1)
    if kind == CommType.ALL_REDUCE:
        phases = [(0, _phase_ns("RS", per_host, chunk, bw0, lat0)),
                  (1, _phase_ns("AR", hosts, chunk / per_host, bw1, lat1)),
                  (0, _phase_ns("AG", per_host, chunk / per_host, bw0, lat0))]
    elif kind == CommType.ALL_GATHER:
        phases = [(1, _phase_ns("AG", hosts, chunk, bw1, lat1)),
                  (0, _phase_ns("AG", per_host, chunk * hosts, bw0, lat0))]
    elif kind == CommType.REDUCE_SCATTER:
        phases = [(0, _phase_ns("RS", per_host, chunk, bw0, lat0)),
                  (1, _phase_ns("RS", hosts, chunk / per_host, bw1, lat1))]
    elif kind == CommType.ALL_TO_ALL:
        phases = [(0, _phase_ns("A2A", per_host, chunk, bw0, lat0)),
                  (1, _phase_ns("A2A", hosts, chunk, bw1, lat1))]
    else:
        return 0.0
    longest = 0.0
    for dim in (0, 1):
        places = [i for i, (d, _) in enumerate(phases) if d == dim]
        before = sum(t for _, t in phases[:places[0]])
        after = sum(t for _, t in phases[places[-1] + 1:])
        longest = max(longest, before + CHUNKS * sum(phases[i][1] for i in places) + after)
    return longest


def fit_two_dims(within: Sequence[Sample], across: Sequence[tuple[Sample, tuple[int, int]]]
                 ) -> tuple[Network, Network]:
    """The links of two dimensions fitted to a run's collectives: within a host (``within``,
    as ``fit``), then between hosts (``across``, each with its group's shape), the latter
    through ``modelled_2d_ns`` with dimension 0 as fitted (or never the bottleneck where no
    collective stayed within a host): least squares over each kind's median as if dimension
    1 bounded every collective, then latency and bandwidth scaled together until the modelled
    collectives add up to the measured ones."""
    inner = fit(within) if within else Network(FAST_GBPS, 0.0, 0, 0.0, 0.0, False)
    link0 = (inner.bandwidth_gbps, inner.latency_ns)
    usable = [(s, shape) for s, shape in across if s.size > 0
              and modelled_2d_ns(s, shape, (link0, (1.0, 1.0))) > 0]
    if not usable:
        return inner, Network(DEFAULT_GBPS, DEFAULT_NS, 0, 0.0, 0.0)
    measured = sum(s.measured_ns for s, _ in usable)
    rows = []
    big = 1e9  # a dimension 1 this slow bounds every collective: the model is linear there
    for s, shape in usable:
        # Dimension 1's latency and inverse-bandwidth coefficients where it bounds the
        # collective, and what is left (dimension 0's phases outside it, the reduction).
        at_lat = modelled_2d_ns(s, shape, (link0, (FAST_GBPS, big)))
        lat = (modelled_2d_ns(s, shape, (link0, (FAST_GBPS, 2 * big))) - at_lat) / big
        at_inv = modelled_2d_ns(s, shape, (link0, (1 / big, 0.0)))
        inv = (modelled_2d_ns(s, shape, (link0, (1 / (2 * big), 0.0))) - at_inv) / big
        rows.append((lat, inv, s.measured_ns - (at_lat - lat * big)))
    x_lat, x_inv = _least_squares(_medians(rows))
    split = x_inv > 0
    if not split:
        x_lat, x_inv = DEFAULT_NS, 1.0

    def total(k: float) -> float:
        lat = x_lat * k if split else x_lat
        return sum(modelled_2d_ns(s, shape, (link0, (1 / (x_inv * k), lat)))
                   for s, shape in usable)

    if total(1e-9) >= measured:  # dimension 0 alone takes all of it
        return inner, Network(FAST_GBPS, 0.0, len(usable), measured, total(1e-9), split)
    low, high = 1e-9, 1.0
    while total(high) < measured:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if total(middle) < measured else (low, middle)
    k = (low + high) / 2
    return inner, Network(1 / (x_inv * k), x_lat * k if split else x_lat, len(usable),
                          measured, total(k), split)



def ranks_per_host(hosts: Mapping[int, str | None]) -> int | None:
    """G where the run's ranks sit on hosts of G ranks each in rank order (rank r on the host
    of rank r - r mod G, as ASTRA-sim numbers NPUs over two dimensions), with two hosts or
    more; else None (one host, a host not recorded, or another layout)."""
    ranks = sorted(hosts)
    if not ranks or ranks != list(range(len(ranks))) or None in hosts.values():
        return None
    counts: dict[str, int] = {}
    for rank in ranks:
        counts[hosts[rank]] = counts.get(hosts[rank], 0) + 1
    per_host = counts[hosts[0]]
    if len(counts) < 2 or any(c != per_host for c in counts.values()):
        return None
    if any(hosts[r] != hosts[r - r % per_host] for r in ranks):
        return None
    return per_host


def group_shape(members: Sequence[int], per_host: int) -> tuple[int, int] | None:
    """(ranks per host, hosts) of a group laid out as a grid on hosts of ``per_host`` ranks
    (the same places on each of its hosts), else None."""
    by_host: dict[int, set[int]] = {}
    for m in members:
        by_host.setdefault(m // per_host, set()).add(m % per_host)
    places = list(by_host.values())
    if any(p != places[0] for p in places):
        return None
    return len(places[0]), len(places)


def shape_of(members: Sequence[int], per_host: int) -> tuple[int, int]:
    """The shape a collective over ``members`` is modelled on: its grid (``group_shape``), else
    (1, all of them), a ring over its members between hosts."""
    return group_shape(members, per_host) or (1, len(members))
