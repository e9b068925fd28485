"""ETs that model time: edges agree with the clock, gaps hold only slack, and a what-if moves.

Checked by changing the world (a real 2-rank gloo program recorded with two communication
volumes, each run's ET predicting the other's measured span) and with the independent checkers
in ../shared/tools, which read our ETs with the reference reader (mlc-chakra)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from chakra_hooks.cli import cli
from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import etio, whatif
from chakra_hooks.converter.stats import rank_stats
from chakra_hooks.linker.enrich.gaps import GAP_NAME

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO.parent / "shared" / "tools"
CORPUS_TRACES = {
    "a100_resnet_nccl": ["pytorch/a100_resnet_nccl"],
    "rtx2080_linear": ["pytorch/rtx2080_linear"],
    "v100_dlrm_8rank": ["pytorch/v100_dlrm_8rank"],
    "sampled_pair": ["kineto_only/sampled_rank-0.json.gz", "kineto_only/sampled_rank-1.json.gz"],
    "b200_eager_rank0": ["kineto_only/b200_eager_rank0.json.gz"],
    "vllm_execution": ["vllm/mi300x_decode_full/graph_execution.json.gz"],
    "tpu_inference_2": ["jax_xla/tpu_inference_2.xplane.pb"],
    "mi300x_jax_conv": ["jax_xla/mi300x_jax_conv.xplane.pb"],
}


def _tool(name: str, *args: str) -> str:
    if not (TOOLS / name).exists():
        pytest.skip(f"{TOOLS / name} is absent")
    run = subprocess.run([sys.executable, str(TOOLS / name), *args], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.fixture(scope="module")
def volume_pair(tmp_path_factory) -> dict[int, Path]:
    """examples/comm_volume.py recorded with 4 MB and 48 MB of extra all-reduce, converted.

    The experiment's premise is that only communication changed. On a shared 2-core machine
    the compute itself can come out tens of percent apart between two recordings (seen: 68
    against 125 ms of host ops; one rank's backward alone 50 against 36 ms): each volume is
    recorded up to RECORDINGS times, alternating, and the first pair (one recording of each) whose
    compute agrees on both ranks is the experiment, so that the prediction is judged on a pair
    that satisfies the premise."""
    root = tmp_path_factory.mktemp("volume")
    runs: dict[int, list[tuple[Path, list[float]]]] = {4: [], 48: []}
    for attempt in range(RECORDINGS):
        for mb in (4, 48):
            capture = root / f"run{mb}_{attempt}"
            subprocess.run([sys.executable, str(REPO / "examples" / "comm_volume.py"),
                            str(capture), "--extra-mb", str(mb)], capture_output=True, timeout=300)
            # Files are judged, not the exit status; the capture is complete by the exit.
            assert (capture / "manifest.json").exists(), f"no capture for {mb} MB"
            out = root / f"et{mb}_{attempt}"
            convert_paths([capture], out, progress=False)
            compute = [_compute_us(etio.read_et(out / f"chakra.{r}.et").nodes) for r in (0, 1)]
            runs[mb].append((out, compute))
            for small, small_compute in runs[4]:
                for large, large_compute in runs[48]:
                    if all(max(c) <= COMPUTE_AGREE * min(c)
                           for c in zip(small_compute, large_compute)):
                        return {4: small, 48: large}
    shown = {mb: [c for _, c in found] for mb, found in runs.items()}
    pytest.fail(f"no pair of comm_volume.py recordings ({RECORDINGS} of each volume) whose "
                f"compute agrees within {COMPUTE_AGREE - 1:.0%} on both ranks (host ops, us, per "
                f"recording and rank: {shown}): the machine is too busy for this experiment")


COMPUTE_AGREE = 1.15  # the premise: the two runs' host-op time within 15 % of each other
# Recordings of each volume at most: every new one is paired with all of the other volume's,
# and a busy half hour has spread three of each over 42-69 ms of host ops per rank, no pair
# within 15 % (2026-11-29); a quiet machine finds its pair in the first or second.
RECORDINGS = 5


def _compute_us(nodes) -> float:
    """Host-op time of one ET (not gaps, not communication): what must not change."""
    total = 0.0
    for n in nodes:
        if n.name != GAP_NAME and n.type not in (5, 6, 7):  # COMM_SEND, COMM_RECV, COMM_COLL
            total += n.duration_micros
    return total


@pytest.mark.extended  # changes the program; tests/cluster changes the network itself
@pytest.mark.parametrize("a, b", [(4, 48), (48, 4)])
def test_one_runs_et_predicts_the_others_span(volume_pair, a, b):
    """Run A's ETs with each collective taking the time it took in run B predict B's measured
    span (less communication as well as more); the reference-reader checker agrees."""
    for rank in (0, 1):
        mine = etio.read_et(volume_pair[a] / f"chakra.{rank}.et").nodes
        theirs = etio.read_et(volume_pair[b] / f"chakra.{rank}.et").nodes
        got = whatif.replay("a", mine, measured_elsewhere=whatif.collective_durations(theirs))
        measured_b = rank_stats("b", theirs).span_us
        assert got.predicted_us == pytest.approx(measured_b, rel=0.20), (a, b, rank)
        assert got.replayed_us == pytest.approx(got.span_us, rel=0.02)
    lines = _tool("et_paths.py", "swap", str(volume_pair[a]), str(volume_pair[b])).split()
    for rank in (0, 1):
        mine = etio.read_et(volume_pair[a] / f"chakra.{rank}.et").nodes
        theirs = etio.read_et(volume_pair[b] / f"chakra.{rank}.et").nodes
        ours = whatif.replay("a", mine, measured_elsewhere=whatif.collective_durations(theirs))
        checker = float(lines[3 * rank + 1])  # its whole-microsecond replay
        assert ours.predicted_us == pytest.approx(checker, rel=0.01)


@pytest.mark.extended  # shares the recordings of the test above (about 45 s to make)
def test_whatif_command_scales_and_swaps(volume_pair):
    small, large = volume_pair[4], volume_pair[48]
    out = CliRunner().invoke(cli, ["whatif", "--json", "--comm-from", str(small), str(large)])
    assert out.exit_code == 0, out.output
    assert all(line and '"predicted_us"' in line for line in out.output.splitlines())
    zero = CliRunner().invoke(cli, ["whatif", "--comm", "0x", str(large)])
    assert zero.exit_code == 0 and "communication x0" in zero.output
    nodes = etio.read_et(large / "chakra.0.et").nodes
    base = whatif.replay("r", nodes)
    gone = whatif.replay("r", nodes, whatif.Change(comm=0.0))
    assert gone.after_us["comm"] == 0
    # communication was on the path (the program waits for every all-reduce): all of it goes
    assert base.predicted_us - gone.predicted_us == pytest.approx(base.before_us["comm"], rel=0.05)
    bad = CliRunner().invoke(cli, ["whatif", "--comm", "faster", str(large)])
    assert bad.exit_code != 0


@pytest.mark.extended  # the same recordings
def test_a_thread_waiting_for_a_collective_has_no_gap_for_it(volume_pair):
    """The main thread waits for each all-reduce: that is an edge, not a gap."""
    nodes = etio.read_et(volume_pair[48] / "chakra.0.et").nodes
    stats = rank_stats("r", nodes)
    comm = sum(n.duration_micros for n in nodes if n.name == "c10d::allreduce_")
    gaps = sum(n.duration_micros for n in nodes if n.name == GAP_NAME)
    assert gaps < 0.2 * comm
    host = stats.idle_us["host"]
    assert host["explained"] > host["unexplained"]


@pytest.fixture(scope="module")
def corpus_outputs(corpus, tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("model")
    out = {}
    for name, rel in CORPUS_TRACES.items():
        for target in ("full", "astra-sim"):
            folder = root / name / target
            convert_paths([corpus / r for r in rel], folder, target=target, progress=False,
                          warn=lambda _: None)
            out[(name, target)] = folder
    return out


def test_no_dependency_ends_after_its_dependant_starts(corpus_outputs):
    """Checked by the reference-reader tool (more than 1 us late: Chakra's resolution)."""
    for (name, target), folder in corpus_outputs.items():
        report = _tool("edges-against-time.py", *map(str, sorted(folder.glob("*.et"))))
        for line in report.splitlines():
            bad = int(re.search(r": (\d+) of \d+ edges", line).group(1))
            assert bad == 0, (name, target, line)


def test_the_critical_path_is_the_span_without_copied_waits(corpus_outputs):
    # The full target: lanes in parallel. (The astra-sim target's slack is per resource, for a
    # simulator that runs one host and one device op at a time: benchmarks/bench_model_time.py
    # holds it to ASTRA-sim itself.)
    for (name, target), folder in corpus_outputs.items():
        if target != "full":
            continue
        for et in folder.glob("*.et"):
            stats = rank_stats(str(et), etio.read_et(et).nodes)
            assert stats.critical_path_us == pytest.approx(stats.span_us, rel=0.01), (name, et)


def test_zero_communication_wins_back_the_exposed_communication(corpus, corpus_outputs):
    """v100_dlrm_8rank rank 1: its compute stream waits for the all-to-all (NCCL) and the host
    for the compute stream; zeroing communication wins back at least half of what the raw
    Kineto trace shows exposed (independent tool)."""
    kineto = next((corpus / "pytorch" / "v100_dlrm_8rank").glob("worker1_*"))
    exposed_ms = float(re.search(r"exposed comm ([\d.]+) ms",
                                 _tool("exposed-comm.py", str(kineto))).group(1))
    nodes = etio.read_et(corpus_outputs[("v100_dlrm_8rank", "full")] / "chakra.1.et").nodes
    base = whatif.replay("r", nodes)
    gone = whatif.replay("r", nodes, whatif.Change(comm=0.0))
    assert (base.predicted_us - gone.predicted_us) / 1e3 >= 0.5 * exposed_ms


def test_waits_the_trace_does_not_record_are_read_from_the_clock(corpus, tmp_path):
    """The sampled trace holds launches only (no event records, waits or syncs): a kernel held
    back until a kernel of another stream ended waited for it."""
    result = convert_paths([corpus / "kineto_only" / "sampled_rank-0.json.gz"], tmp_path,
                           progress=False)
    assert result.ranks[0].stats["stream_waits_by_clock"] > 0
    # the ResNet rank records cudaStreamWaitEvent without the stream the event was on
    resnet = convert_paths([corpus / "pytorch" / "a100_resnet_nccl"], tmp_path / "r",
                           progress=False).ranks[0].stats
    assert resnet["host_op_parts_added"] > 1000  # kernels wait for their launch, not the op
    assert resnet["thread_waits_by_clock"] >= 3  # the main thread waits for backward, 3 steps
