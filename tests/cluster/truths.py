"""Ground truths on the emulated cluster: the recordings (``FLAT`` and ``TWO_TIER`` plans) and
what each prediction gives against the run it predicts. Used by
tests/cluster/test_ground_truths.py and benchmarks/bench_cluster.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chakra_hooks.converter import network_change as nets
from chakra_hooks.converter import peers as run_peers
from chakra_hooks.converter import run_model
from chakra_hooks.converter import whatif

from .run import Phase

KB, MB = 1 << 10, 1 << 20
RATE = 200  # Mbit/s: the links' rate in the R runs, doubled in the 2R runs
# Gradients of five sizes, 3.8 MB a step: the fit sees latency and bandwidth apart. Without the
# 64 KB one (a bias, a norm), the 3-4 ms an all-reduce takes here whatever its size (gloo's
# hand-offs) was not pinned down, the fit gave bandwidth all of it, and twice the rate was
# predicted 4 % too fast.
GRADIENTS = [64 * KB, 256 * KB, 512 * KB, 1 * MB, 2 * MB]
# Mostly small all-reduces (their time is latency: gloo's hand-offs between processes, not
# the link's rate) and one of 1 MB.
SMALL = [1 * KB, 2 * KB, 4 * KB, 8 * KB, 16 * KB, 32 * KB] * 2 + [1 * MB]
STRAGGLER = 3  # the rank made slow


def flat_plan(pairs: int = 3, noisy_pairs: int = 5) -> list[Phase]:
    """4 ranks on one bridge: per pair, the network at R and 2R and a straggler (rank 3 at
    twice its compute) and without; ``noisy_pairs`` pairs of latency-bound collectives and of
    DDP at R and 2R. A small all-reduce's time is gloo's hand-offs between 4 processes on 2
    cores (a 1 KB one: 2-25 ms, 8 at the median), so those phases compute 195 ms a step beside
    their 100 ms of small collectives; DDP's buckets share the links two at a time, and its
    pairs scatter more (0.88-1.07 in three). Every other pair runs 2R first, so that a drift
    does not favour one side."""
    phases = []
    for i in range(max(pairs, noisy_pairs)):
        order = (("R", RATE), ("2R", 2 * RATE))[::1 if i % 2 == 0 else -1]
        if i < pairs:
            phases += [Phase(f"net{i}_{n}", GRADIENTS, rate) for n, rate in order]
        if i < noisy_pairs:
            phases += [Phase(f"small{i}_{n}", SMALL, rate, forward_ms=5, backward_ms=10)
                       for n, rate in order]
            phases += [Phase(f"ddp{i}_{n}", [MB] * 8, rate, mode="ddp", forward_ms=10,
                             backward_ms=20) for n, rate in order]
        if i < pairs:
            phases += [Phase(f"slow{i}", GRADIENTS, 2 * RATE, forward_ms=20, backward_ms=40,
                             scale={STRAGGLER: 2.0}),
                       Phase(f"even{i}", GRADIENTS, 2 * RATE, forward_ms=20, backward_ms=40)]
    return phases


def two_tier_plan(pairs: int = 5) -> list[Phase]:
    """2 hosts of 2 ranks: links within a host at 1 Gbit/s, each host's uplink at R, then 2R
    (every other pair the other way round); every step all-reduces the gradients over all 4
    ranks and 256 KB within each host. Its pairs scatter most (a phase in which the machine
    slowed down took 2.4x as long for one step's 2 MB all-reduce), hence five."""
    phases = []
    for i in range(pairs):
        order = (("R", RATE), ("2R", 2 * RATE))[::1 if i % 2 == 0 else -1]
        phases += [Phase(f"tier{i}_{n}", GRADIENTS, 1000, uplink_mbit=rate, host_bytes=256 * KB)
                   for n, rate in order]
    return phases


@dataclass
class Run:
    """A converted recording, read as the run tools read it."""

    ranks: list
    groups: dict
    world: int
    peers: run_peers.Peers

    @classmethod
    def read(cls, folder: Path) -> Run:
        ranks, groups, world = run_model.read_run(sorted(Path(folder).glob("*.et")))
        return cls(ranks, groups, world, run_peers.analyse(ranks, groups, world))

    def span_us(self) -> float:
        return whatif.replay_run(self.ranks, peers=self.peers).span_us

    def predict(self, change: whatif.Change = whatif.Change(), only: set[int] | None = None,
                network: nets.NetworkChange | None = None) -> float:
        """The run's predicted span (us) with ``change`` and / or ``network``."""
        factors = None
        if network:
            fitted = nets.fit_run(self.ranks, self.peers, self.groups, self.world)
            factors, _ = fitted.factors(network)
        return whatif.replay_run(self.ranks, change, only, self.peers,
                                 comm_factors=factors).predicted_us


def bandwidth(factor: float, dim: int | None = None) -> nets.NetworkChange:
    return nets.NetworkChange({dim: factor})


def ratios(runs: dict[str, Run]) -> dict[str, list[float]]:
    """Per ground truth, predicted over measured for each pair recorded (1.0: exact)."""
    pairs = 1 + max(int("".join(c for c in name.split("_")[0] if c.isdigit()) or 0)
                    for name in runs)
    out: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        out.setdefault(name, []).append(value)

    for i in range(pairs):
        for kind in ("net", "small", "ddp", "tier"):
            r, r2 = runs.get(f"{kind}{i}_R"), runs.get(f"{kind}{i}_2R")
            if r is None or r2 is None:
                continue
            dim = nets.ACROSS if kind == "tier" else None
            add(f"{kind} R -> 2R", r.predict(network=bandwidth(2.0, dim)) / r2.span_us())
            add(f"{kind} 2R -> R", r2.predict(network=bandwidth(0.5, dim)) / r.span_us())
            if kind == "small":
                add("small R -> 2R, flat --comm 0.5x",
                    r.predict(whatif.Change(comm=0.5)) / r2.span_us())
        slow, even = runs.get(f"slow{i}"), runs.get(f"even{i}")
        if slow is not None and even is not None:
            add("straggler made even", slow.predict(whatif.Change(compute=0.5), {STRAGGLER})
                / even.span_us())
            add("straggler made slow", even.predict(whatif.Change(compute=2.0), {STRAGGLER})
                / slow.span_us())
    return out


# ------------------------------------------------------------------ scale: the ranks change

def scale_plan(repeats: int = 3) -> list[Phase]:
    """The same work per rank at any number of ranks: the gradients all-reduced over every
    rank each step (``dp``), and DDP's buckets (``ddp``), ``repeats`` of each."""
    phases = []
    for i in range(repeats):
        phases += [Phase(f"dp{i}", GRADIENTS, RATE),
                   Phase(f"ddp{i}", [MB] * 8, RATE, mode="ddp", forward_ms=10, backward_ms=20)]
    return phases


def tier_scale_plan(repeats: int = 3) -> list[Phase]:
    """Hosts of 2 ranks (1 Gbit/s within, uplinks at R), the gradients all-reduced over every
    rank and 256 KB within each host every step, at any number of hosts."""
    return [Phase(f"tier{i}", GRADIENTS, 1000, uplink_mbit=RATE, host_bytes=256 * KB)
            for i in range(repeats)]


def keep_rank_0(capture: Path, out: Path) -> Path:
    """A copy of a capture with rank 0's files only, as Megatron-Bridge keeps a run."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for path in capture.iterdir():
        if "rank0" in path.name or path.name in ("rank-0.manifest.json", "manifest.json"):
            shutil.copy(path, out)
    return out


def scale_ratios(by_world: dict[int, dict[str, Path]], work: Path, base: int,
                 completed: int | None = None) -> dict[str, list[float]]:
    """Per scaling, the run of ``base`` ranks scaled (``scale --dp``) to each other recorded
    size, predicted span over the measured one, phase by phase; with ``completed``, that size's
    capture kept on rank 0 and made whole (``scale --world``) against its full recording.
    ``by_world``: ranks -> phase name -> converted folder (its capture beside it)."""
    from chakra_hooks.convert import convert_paths
    from chakra_hooks.converter.scale import scale_run

    out: dict[str, list[float]] = {}
    for world, phases in sorted(by_world.items()):
        for name, folder in sorted(phases.items()):
            kind = name.rstrip("0123456789")
            measured = Run.read(folder).span_us()
            if world != base:
                made = scale_run(by_world[base][name], work / f"{name}_{base}to{world}",
                                 dp=world // base)
                out.setdefault(f"{kind} {base} -> {world}", []).append(
                    made.predicted_us / measured)
            if world == completed:
                capture = keep_rank_0(folder.with_name(name), work / f"{name}_rank0")
                converted = work / f"{name}_rank0_et"
                convert_paths([capture], converted, progress=False, warn=lambda _: None,
                              overwrite=True)
                made = scale_run(converted, work / f"{name}_rank0_made", world=world)
                out.setdefault(f"{kind} rank 0 of {world} made whole", []).append(
                    made.predicted_us / measured)
    return out


def transfer_growth(small: Run, large: Run, least_bytes: int) -> list[tuple[int, float, float]]:
    """Per all-reduce size of at least ``least_bytes`` over every rank: (size, its median
    transfer in ``large`` over that in ``small``, the ring model's ratio on ``small``'s fitted
    network)."""
    import statistics

    from chakra_hooks.converter.targets.astra_sim import network as fitting

    def per_size(run: Run) -> tuple[dict[int, float], nets.Link]:
        fit = nets.fit_run(run.ranks, run.peers, run.groups, run.world)
        by: dict[int, list[float]] = {}
        for dim, sample in fit.samples.values():
            if sample.npus == run.world and sample.size >= least_bytes:
                by.setdefault(sample.size, []).append(sample.measured_ns)
        return {k: statistics.median(v) for k, v in by.items()}, fit.links[max(fit.links)]

    before, link = per_size(small)
    after, _ = per_size(large)
    out = []
    for size in sorted(set(before) & set(after)):
        model = [fitting.modelled_ns(fitting.Sample(0, size, run.world, 0.0), link.bandwidth_gbps,
                                     link.latency_ns) for run in (large, small)]
        out.append((size, after[size] / before[size], model[0] / model[1]))
    return out
