"""Ground truths on the emulated cluster (tests/cluster/), pair by pair, with their spread.

    python benchmarks/bench_cluster.py [--pairs 3] [--astra BIN] [--keep DIR]
    python benchmarks/bench_cluster.py --scale [--pairs 3] [--astra BIN] [--keep DIR]
    python benchmarks/bench_cluster.py --scale --keep DIR --recorded [--astra BIN]

Records the flat plan (4 ranks on one bridge: the links at R and 2R, latency-bound
collectives at R and 2R, DDP at R and 2R, a straggler) and the two-tier plan (2 hosts of 2
ranks, uplinks at R and 2R), ``--pairs`` of each in one launch per plan, converts them, and
prints for every ground truth each pair's predicted / measured span, the median and the spread.
With ``--astra``: ASTRA-sim (../shared/tools/astra-run) on each R and 2R run's
``--target astra-sim`` conversion, its fitted network's bandwidth scaled by 2 (0.5), against
the other run's measured span. With ``--scale``: ``scale``'s ground truths instead (the same
work per rank at 2, 4 and 8 ranks, and 2 and 4 hosts of 2 ranks; a 2-rank run scaled to the
others, a 4-rank run kept on rank 0 made whole), each beside ASTRA-sim on the scaled
``--target astra-sim`` conversion. Needs root (network namespaces), except with
``--recorded``: the recordings an earlier ``--keep DIR`` left, converted again."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from chakra_hooks.convert import convert_paths  # noqa: E402
from tests.cluster import truths  # noqa: E402
from tests.cluster.net import unavailable  # noqa: E402
from tests.cluster.run import record  # noqa: E402

ASTRA_RUN = REPO.parent / "shared" / "tools" / "astra-run"


def astra_ratio(capture: Path, factor: float, measured_us: float, astra: str,
                work: Path, between_hosts_only: bool = False) -> float | None:
    """ASTRA-sim's finish with the fitted network's bandwidth(s) times ``factor`` (with
    ``between_hosts_only``, the last dimension's), over ``measured_us``."""
    out = work / f"{capture.name}_astra"
    convert_paths([capture], out, target="astra-sim", progress=False, warn=lambda _: None,
                  overwrite=True)
    network = out / "astra_network.yml"
    text = network.read_text()

    def scale(found: re.Match) -> str:
        values = [float(v) for v in found.group(1).split(",")]
        chosen = range(len(values) - 1, len(values)) if between_hosts_only else range(len(values))
        return "bandwidth: [ " + ", ".join(f"{v * factor if i in chosen else v:.6g}"
                                           for i, v in enumerate(values)) + " ]"

    scaled = re.sub(r"bandwidth: \[ ([^\]]+) \]", scale, text)
    changed = work / f"{capture.name}_x{factor:g}.yml"
    changed.write_text(scaled)
    ranks = len(list(out.glob("chakra.*.et")))
    finish = simulate(out, changed, ranks, astra)
    return finish / measured_us if finish else None


def simulate(out: Path, network: Path, npus: int, astra: str) -> float | None:
    """ASTRA-sim's finish (us) on the conversion in ``out`` with ``network``, or None."""
    env = dict(os.environ, ASTRA_BIN=astra, NETWORK_CONFIG=str(network),
               SYSTEM_CONFIG=str(out / "astra_system.json"),
               REMOTE_MEMORY_CONFIG=str(out / "astra_memory.json"))
    if (out / "comm_group.json").exists():
        env["COMM_GROUP_CONFIG"] = str(out / "comm_group.json")
    run = subprocess.run([str(ASTRA_RUN), str(out / "chakra"), str(npus)], env=env,
                         capture_output=True, text=True, timeout=1800)
    found = re.search(r"RESULT: OK npus=\d+ max_finish_cycles=(\d+)", run.stdout)
    return int(found.group(1)) / 1e3 if found else None


def astra_scaled(capture: Path, work: Path, astra: str, measured_us: float, **how
                 ) -> tuple[float, float | None]:
    """Our replay of ``capture``'s astra-sim conversion scaled (``scale_run`` keywords
    ``how``) and ASTRA-sim on the same ETs, each over ``measured_us``."""
    from chakra_hooks.converter.scale import scale_run

    converted = work / f"{capture.name}_{capture.parent.name}_astra"
    convert_paths([capture], converted, target="astra-sim", progress=False,
                  warn=lambda _: None, overwrite=True)
    out = work / f"{converted.name}_scaled"
    done = scale_run(converted, out, **how)
    finish = simulate(out, out / "astra_network.yml", done.plan.world, astra)
    return done.predicted_us / measured_us, finish / measured_us if finish else None


def scale_main(args, work: Path) -> None:
    def reconverted(root: Path, n: int, plan: list, **_) -> dict[str, Path]:
        """The recordings already in ``root``, converted again by this code."""
        for phase in plan:
            convert_paths([root / phase.name], root / f"{phase.name}_et", progress=False,
                          warn=lambda _: None, overwrite=True)
        return {phase.name: root / f"{phase.name}_et" for phase in plan}

    take = reconverted if args.recorded else record
    flat = {n: take(work / f"flat{n}", n, truths.scale_plan(args.pairs)) for n in (2, 4, 8)}
    tiers = {n: take(work / f"tier{n}", n, truths.tier_scale_plan(args.pairs), per_host=2)
             for n in (4, 8)}
    found = truths.scale_ratios(flat, work / "scaled", 2, completed=4)
    found.update(truths.scale_ratios(tiers, work / "scaled_tiers", 4))
    print(f"{'scaled run':32s} {'median':>7s} {'spread':>7s}  each (predicted / measured)"
          + ("; on the astra-sim conversion, ours/ASTRA-sim" if args.astra else ""))
    for name, values in found.items():
        line = (f"{name:32s} {statistics.median(values):7.3f} {max(values) - min(values):7.3f}  "
                + " ".join(f"{v:.3f}" for v in values))
        if args.astra:
            kind, _, rest = name.partition(" ")
            runs = tiers if kind == "tier" else flat
            cells = []
            for i in range(args.pairs):
                phase = f"{kind}{i}"
                if "made whole" in rest:
                    world = int(rest.split()[3])
                    measured = truths.Run.read(runs[world][phase]).span_us()
                    capture = truths.keep_rank_0(runs[world][phase].with_name(phase),
                                                 work / "astra" / f"{phase}_rank0" / phase)
                    ours, ratio = astra_scaled(capture, work / "astra", args.astra, measured,
                                               world=world)
                else:
                    small, large = (int(v) for v in rest.split(" -> "))
                    measured = truths.Run.read(runs[large][phase]).span_us()
                    ours, ratio = astra_scaled(runs[small][phase].with_name(phase),
                                               work / "astra" / f"{small}to{large}",
                                               args.astra, measured, dp=large // small)
                cells.append(f"{ours:.3f}/" + (f"{ratio:.3f}" if ratio else "failed"))
            line += "; " + " ".join(cells)
        print(line)
    for small, large, runs, name in ((2, 8, flat, "dp"), (4, 8, tiers, "tier")):
        for i in range(args.pairs):
            growth = truths.transfer_growth(truths.Run.read(runs[small][f"{name}{i}"]),
                                            truths.Run.read(runs[large][f"{name}{i}"]), 0)
            print(f"{name}{i} all-reduce transfer {small} -> {large} ranks, measured (ring "
                  "model): " + "; ".join(f"{size >> 10} KB x{got:.2f} ({model:.2f})"
                                         for size, got, model in growth))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--astra", help="ASTRA-sim's analytical congestion-unaware binary")
    parser.add_argument("--keep", type=Path, help="record into this folder and keep it")
    parser.add_argument("--scale", action="store_true", help="scale's ground truths instead")
    parser.add_argument("--recorded", action="store_true",
                        help="with --scale and --keep: the recordings already in --keep")
    args = parser.parse_args()
    why = None if args.recorded else unavailable()
    if args.recorded and not args.keep:
        sys.exit("bench_cluster: --recorded reads the recordings of --keep DIR")
    if why:
        sys.exit(f"bench_cluster: {why}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_cluster_"))
    if args.scale:
        scale_main(args, work)
        return
    found = {}
    for name, plan, per_host in (("flat", truths.flat_plan(args.pairs, args.pairs + 2), None),
                                 ("tiers", truths.two_tier_plan(args.pairs + 2), 2)):
        found.update(record(work / name, 4, plan, per_host=per_host))
    runs = {name: truths.Run.read(folder) for name, folder in found.items()}
    print(f"{'ground truth':36s} {'median':>7s} {'spread':>7s}  pairs (predicted / measured)")
    for name, values in truths.ratios(runs).items():
        spread = max(values) - min(values)
        print(f"{name:36s} {statistics.median(values):7.3f} {spread:7.3f}  "
              + " ".join(f"{v:.3f}" for v in values))
    offsets = sum(bool(run.peers.offsets_us) for run in runs.values())
    print(f"clock offsets applied: {offsets} of {len(runs)} recordings")
    if args.astra:
        for kind in ("net", "small", "ddp", "tier"):
            cells = []
            for i in range(args.pairs + 2):
                r, r2 = f"{kind}{i}_R", f"{kind}{i}_2R"
                if r not in runs:
                    continue
                plan = "tiers" if kind == "tier" else "flat"
                for src, dst, factor in ((r, r2, 2.0), (r2, r, 0.5)):
                    ratio = astra_ratio(work / plan / src, factor, runs[dst].span_us(),
                                        args.astra, work, between_hosts_only=kind == "tier")
                    cells.append(f"{src} x{factor:g}: " + (f"{ratio:.3f}" if ratio else "failed"))
            if cells:
                print(f"ASTRA-sim {kind}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
