"""Every host op, its time and every collective of the recording are in the ET: counted in the
raw Kineto trace and in our ET read back with the reference reader (tests/conservation.py),
on the programs users run (torch DDP and async all-reduce hooks on gloo, whose collectives
overlap backward) and on every PyTorch trace of the corpus."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chakra_hooks.convert import convert_paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conservation import conservation, node_attrs  # noqa: E402 (tests/conservation.py)

REPO = Path(__file__).resolve().parents[2]
ASTRA_RUN = REPO.parent / "shared" / "tools" / "astra-run"
MODES = ("ddp", "no_sync", "static_graph", "hooks", "fsdp")
CORPUS_RANKS = {  # inputs -> {rank: its Kineto file}
    "pytorch/a100_resnet_nccl": {0: "pytorch/a100_resnet_nccl/kineto.json.gz"},
    "pytorch/a100_simple_add": {0: "pytorch/a100_simple_add/kineto.json.gz"},
    "pytorch/rtx2080_linear": {0: "pytorch/rtx2080_linear/kineto.json.gz"},
    "pytorch/v100_dlrm_8rank": {r: f"pytorch/v100_dlrm_8rank/worker{r}_*" for r in range(8)},
    "kineto_only/sampled_rank-0.json.gz": {0: "kineto_only/sampled_rank-0.json.gz"},
    "kineto_only/b200_eager_rank0.json.gz": {0: "kineto_only/b200_eager_rank0.json.gz"},
    "vllm/mi300x_decode_full/graph_execution.json.gz":
        {0: "vllm/mi300x_decode_full/graph_execution.json.gz"},
}


def record_ddp(root: Path, mode: str, extra_mb: float = 4) -> Path:
    """examples/ddp_overlap.py recorded in ``mode``; returns the capture folder."""
    import warnings

    capture = root / f"{mode}{extra_mb:g}"
    try:
        subprocess.run([sys.executable, str(REPO / "examples" / "ddp_overlap.py"), str(capture),
                        "--mode", mode, "--extra-mb", str(extra_mb)], capture_output=True,
                       timeout=120)
    except subprocess.TimeoutExpired:
        # Seen about once in 80 runs: the program hangs after the window, in its last
        # untraced steps, barrier or destroy_process_group, its capture complete (the
        # manifest is written last). Said, and the capture judged as any other.
        warnings.warn(f"ddp_overlap.py --mode {mode} did not exit within 120 s")
    # Files are judged, not the exit status; the capture is complete by the exit.
    assert (capture / "manifest.json").exists(), f"no capture for {mode}"
    return capture


def _check(kineto_by_rank: dict[int, Path], out: Path, read) -> list[str]:
    problems = []
    for rank, kineto in kineto_by_rank.items():
        _, nodes = read(out / f"chakra.{rank}.et")
        problems += [f"rank {rank}: {p}" for p in conservation(kineto, nodes).problems()]
    return problems


@pytest.mark.parametrize("mode", MODES)
def test_ddp_keeps_every_op_and_collective(mode, tmp_path, reference_reader):
    """DDP's bucket all-reduces start inside backward and end on gloo's threads; the ET
    observer then nests the backward ops that follow under ops that had ended (about 100-300
    per rank). Before: 3-13 of 24 AddmmBackward0 per rank kept, 41-61 % of the time, up to 16
    of 27 all-reduces lost, with "linked 100 %". FSDP2 (all-gathers and reduce-scatters
    around each layer) is held to the same count."""
    capture = record_ddp(tmp_path, mode)
    out = tmp_path / "et"
    warnings: list[str] = []
    convert_paths([capture], out, progress=False, warn=warnings.append)
    kineto = {r: capture / f"kineto.rank{r}.pt.trace.json" for r in (0, 1)}
    assert _check(kineto, out, reference_reader) == []
    # The correction is said, not silent (FSDP2's recordings here needed none).
    if mode != "fsdp":
        assert any("nested in the ET under ops that had ended" in w for w in warnings), warnings


def _astra_run(out: Path, npus: int) -> subprocess.CompletedProcess | None:
    """ASTRA-sim (../shared/tools/astra-run, ASTRA_BIN) on a --target astra-sim output with its
    fitted network, every NPU held to have run every node; None without the binary."""
    if not os.environ.get("ASTRA_BIN") or not ASTRA_RUN.exists():
        return None
    run = subprocess.run([str(ASTRA_RUN), str(out / "chakra"), str(npus)], capture_output=True,
                         text=True, timeout=600, env=dict(
                             os.environ, NETWORK_CONFIG=str(out / "astra_network.yml"),
                             SYSTEM_CONFIG=str(out / "astra_system.json")))
    assert f"RESULT: OK npus={npus}" in run.stdout, run.stdout[-2000:]
    return run


def _transfer_spans(nodes_by_rank: dict[int, list]) -> dict[int, list[tuple[float, float]]]:
    """Per rank, each collective's transfer (ns): from the latest start of its i-th collective
    over the ranks to its end (as ../shared/tools/peer-wait.py splits them)."""
    times = {}
    for rank, nodes in nodes_by_rank.items():
        colls = []
        for n in nodes:
            if n.type == 7:  # COMM_COLL_NODE
                a = node_attrs(n)
                colls.append((a["start_ns"], a["start_ns"] + a["duration_ns"]))
        times[rank] = sorted(colls)
    return {rank: [(max(times[r][i][0] for r in times), end) for i, (_, end) in enumerate(spans)]
            for rank, spans in times.items()}


def _union(spans: list[tuple[float, float]]) -> float:
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        covered += max(end - max(start, reach), 0.0)
        reach = max(reach, end)
    return covered


def test_ddp_collectives_that_ran_at_once_share_the_fitted_network(tmp_path, reference_reader):
    """gloo runs DDP's buckets on two threads at once; ASTRA-sim keeps one communication op in
    flight per NPU and runs them one after another. The network is fitted to the time the
    transfers covered together, not to their sum (which simulated the 32 MB run at 1.24-1.34x
    its span; now 1.05), and with ASTRA_BIN set ASTRA-sim ends within 5 % of the span."""
    capture = record_ddp(tmp_path, "ddp", extra_mb=32)
    out = tmp_path / "astra"
    convert_paths([capture], out, target="astra-sim", progress=False, warn=lambda _: None)
    nodes = {r: reference_reader(out / f"chakra.{r}.et")[1] for r in (0, 1)}
    transfers = _transfer_spans(nodes)
    together = sum(_union(spans) for spans in transfers.values())
    apart = sum(end - start for spans in transfers.values() for start, end in spans)
    assert together < 0.9 * apart  # they did overlap: the case this test is about
    header = (out / "astra_network.yml").read_text().splitlines()[0]
    fitted_ms = float(header.split("(")[1].split(" ms")[0].replace(",", ""))
    assert fitted_ms == pytest.approx(together / 1e6, rel=0.01), header
    run = _astra_run(out, 2)
    if run is not None:
        simulated = float(run.stdout.split("max_finish_cycles=")[1].split()[0])
        span = max(max(a["start_ns"] + a.get("duration_ns", 0) for a in map(node_attrs, ns)
                       if "start_ns" in a) -
                   min(node_attrs(n)["start_ns"] for n in ns if "start_ns" in node_attrs(n))
                   for ns in nodes.values())
        assert simulated == pytest.approx(span, rel=0.05)


def test_sendrecv_ring_keeps_every_op_and_collective(tmp_path, reference_reader):
    """Four gloo ranks passing 4 MB round a ring with isend / irecv and wait."""
    capture = tmp_path / "ring"
    subprocess.run([sys.executable, str(REPO / "examples" / "sendrecv_ring.py"), str(capture)],
                   capture_output=True, timeout=300)
    assert (capture / "manifest.json").exists(), "no capture for the ring"
    out = tmp_path / "et"
    convert_paths([capture], out, progress=False, warn=lambda _: None)
    kineto = {r: capture / f"kineto.rank{r}.pt.trace.json" for r in range(4)}
    assert _check(kineto, out, reference_reader) == []
    for rank in range(4):  # a send and a receive per recorded step, each with its peer
        _, nodes = reference_reader(out / f"chakra.{rank}.et")
        assert sorted(n.type for n in nodes if n.type in (5, 6)) == [5, 5, 5, 6, 6, 6]
    # ASTRA-sim: the network fitted to the 12 sends; the host ops of these CPU-only ranks
    # written as device compute (this ASTRA-sim aborts the run on a CPU node when its first
    # NPU finishes: 1 of 4 did before), and with ASTRA_BIN set, every NPU runs every node.
    astra = tmp_path / "astra"
    convert_paths([capture], astra, target="astra-sim", progress=False, warn=lambda _: None)
    assert "fitted by chakra-hooks to 12 measured" in (astra / "astra_network.yml").read_text()
    for rank in range(4):
        _, nodes = reference_reader(astra / f"chakra.{rank}.et")
        comp = [n for n in nodes if n.type == 4]  # COMP_NODE
        assert comp and not [n for n in comp if node_attrs(n).get("is_cpu_op")]
    _astra_run(astra, 4)


def test_corpus_keeps_every_op_and_collective(corpus, tmp_path, reference_reader):
    problems = []
    for inputs, ranks in CORPUS_RANKS.items():
        out = tmp_path / inputs.replace("/", "_")
        convert_paths([corpus / inputs], out, progress=False, warn=lambda _: None)
        kineto = {r: next(iter(sorted(corpus.glob(pattern)))) for r, pattern in ranks.items()}
        problems += [f"{inputs}: {p}" for p in _check(kineto, out, reference_reader)]
    assert problems == []


def test_an_escaped_annotation_promotes_its_ops_but_not_what_they_hold():
    """Under an annotation that escaped its op (``Optimizer.step`` nested by the ET in the
    backward op before it), each op is top-level, timed or not; what an op without Kineto
    times holds stays inside it (nothing to place it by), and a timed op's children inside
    its range stay inside it too."""
    from chakra_hooks.linker.pytorch.et import USER_SCOPE
    from chakra_hooks.linker.pytorch.et_nodes import EtNode
    from chakra_hooks.linker.pytorch.kineto_events import KEvent
    from chakra_hooks.linker.pytorch.link import _escaped

    def node(i, name, *children, scope=0):
        n = EtNode(id=i, name=name, scope=scope)
        n.children = list(children)
        return n

    untimed_child, timed_child = node(5, "aten::empty"), node(7, "aten::mul")
    untimed, timed = node(4, "aten::zeros", untimed_child), node(6, "aten::add_", timed_child)
    step = node(3, "Optimizer.step#SGD.step", untimed, timed, scope=USER_SCOPE)
    backward = KEvent("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", pid=1,
                      tid=1, start=0, dur=100)
    by_et = {3: KEvent(step.name, "user_annotation", pid=1, tid=1, start=200, dur=100),
             6: KEvent("aten::add_", "cpu_op", pid=1, tid=1, start=250, dur=20),
             7: KEvent("aten::mul", "cpu_op", pid=1, tid=1, start=255, dur=5)}
    found: list = []
    _escaped([step], backward, by_et, found)
    assert [n.id for n in found] == [4, 6]
