"""Does the ET replay to what was measured? Per corpus trace: the recorded span, the critical
path of the ET without and with ``host_gap`` nodes (``convert --no-gaps`` / default), and, with
``--astra BIN`` (ASTRA-sim's analytical congestion-unaware binary), the simulated time of the
``--target astra-sim`` output (which has no gap nodes yet) run by ``../shared/tools/astra-run``
(which also checks that every node of every NPU ran).

    python benchmarks/bench_fidelity.py [--astra BIN] [--corpus ../shared/corpus]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import etio
from chakra_hooks.converter.stats import rank_stats

REPO = Path(__file__).resolve().parent.parent
TRACES = {
    "a100_resnet_nccl": "pytorch/a100_resnet_nccl",
    "a100_simple_add": "pytorch/a100_simple_add",
    "rtx2080_linear": "pytorch/rtx2080_linear",
    "v100_dlrm_8rank": "pytorch/v100_dlrm_8rank",
    "sampled_rank-0": "kineto_only/sampled_rank-0.json.gz",
    "sampled_rank-1": "kineto_only/sampled_rank-1.json.gz",
    # both ranks in one run: their collectives paired across ranks (converter/run.py)
    "sampled_pair": ("kineto_only/sampled_rank-0.json.gz", "kineto_only/sampled_rank-1.json.gz"),
    "b200_eager_rank0": "kineto_only/b200_eager_rank0.json.gz",
    "vllm_capture": "vllm/mi300x_decode_full/graph_capture_rank_0.pt.trace.json.gz",
    "vllm_execution": "vllm/mi300x_decode_full/graph_execution.json.gz",
    "tpu_inference_2": "jax_xla/tpu_inference_2.xplane.pb",
    "mi300x_jax_conv": "jax_xla/mi300x_jax_conv.xplane.pb",
}


def _measure(sources: list[Path], out: Path, gaps: bool, target: str = "full"
             ) -> tuple[float, float]:
    """(span us, critical path us) over the ranks of one conversion: the run's longest."""
    convert_paths(sources, out, target=target, gaps=gaps, progress=False, warn=lambda _: None)
    spans, paths = [], []
    for et in sorted(out.glob("*.et")):
        r = rank_stats(str(et), etio.read_et(et).nodes)
        spans.append(r.span_us)
        paths.append(r.critical_path_us)
    return max(spans), max(paths)


def _astra(out: Path, astra: str) -> str:
    ranks = len(list(out.glob("chakra.*.et")))
    env = dict(os.environ, ASTRA_BIN=astra)
    if (out / "comm_group.json").exists():
        env["COMM_GROUP_CONFIG"] = str(out / "comm_group.json")
    run = subprocess.run([str(REPO.parent / "shared" / "tools" / "astra-run"),
                          str(out / "chakra"), str(max(ranks, 1))],
                         capture_output=True, text=True, env=env, timeout=900)
    found = re.search(r"RESULT: OK npus=\d+ max_finish_cycles=(\d+)", run.stdout)
    return f"{int(found.group(1)) / 1e6:,.3f}" if found else "FAILED"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--astra", help="ASTRA-sim analytical (congestion-unaware) binary")
    ap.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    args = ap.parse_args()
    print(f"{'trace':<18} {'span ms':>11} {'path ms, ops only':>18} {'path ms, gaps':>14}"
          f" {'coverage':>9}" + (f" {'astra-sim ms':>13} {'/ span':>7}" if args.astra else ""))
    for name, rel in TRACES.items():
        source = [Path(args.corpus) / r for r in ((rel,) if isinstance(rel, str) else rel)]
        with tempfile.TemporaryDirectory() as tmp:
            span, before = _measure(source, Path(tmp) / "ops", gaps=False)
            _, after = _measure(source, Path(tmp) / "gaps", gaps=True)
            line = (f"{name:<18} {span / 1e3:>11,.3f} {before / 1e3:>18,.3f} "
                    f"{after / 1e3:>14,.3f} {after / span:>9.1%}")
            if args.astra:
                _measure(source, Path(tmp) / "astra", gaps=True, target="astra-sim")
                simulated = _astra(Path(tmp) / "astra", args.astra)
                ratio = (f"{float(simulated.replace(',', '')) * 1e3 / span:>7.2f}"
                         if simulated != "FAILED" else "")
                line += f" {simulated:>13} {ratio}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
