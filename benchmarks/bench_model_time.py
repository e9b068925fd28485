"""Is the ET a model of time? Per corpus trace, side by side with the independent checkers in
../shared/tools (which read our ETs with the reference reader, mlc-chakra):

- edges against the clock (a parent that ended more than 1 us after its child started): ours,
  and ``edges-against-time.py``'s;
- longest path with measured durations / measured span (ours = ``et_paths.py zero``'s);
- idle time on host and device lanes, explained by dependencies vs unexplained (gaps);
- exposed communication (communication that no other device work overlaps): from our ET, and
  ``exposed-comm.py``'s from the raw Kineto trace; and what zeroing communication wins back
  (ours = ``whatif --comm 0``, and ``et_paths.py zero``'s);
- the ground-truth pair: examples/comm_volume.py recorded with 4, 64 and 256 MB of extra
  all-reduce; each run's ETs with the other run's measured collective times predict its span
  (ours = ``whatif --comm-from``, and ``et_paths.py swap``'s);
- the ranks together: per rank the share of its collectives' time that waited for a peer
  (ours, and ``peer-wait.py``'s from the raw Kineto files), the transfer, the straggler and its
  slowdown S, and ``whatif --comm 0.25x`` / ``--comm 0`` over the run;
- with ``--astra BIN``: ASTRA-sim (analytical, congestion unaware) on the ``--target
  astra-sim`` output with the network fitted by ``convert`` (``astra_network.yml``), then that
  network's bandwidth x4 and /4, and a 10^6 GB/s / 1 ns network.

    python benchmarks/bench_model_time.py [--astra BIN] [--corpus ../shared/corpus]
                                          [--no-pair] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import etio, whatif
from chakra_hooks.converter.attrs import attr_dict, value_of
from chakra_hooks.converter.run_model import node_times
from chakra_hooks.converter.stats import rank_stats

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO.parent / "shared" / "tools"
PY = sys.executable
TRACES = {  # name -> (inputs, Kineto files for exposed-comm.py)
    "a100_resnet_nccl": (["pytorch/a100_resnet_nccl"], ["pytorch/a100_resnet_nccl/kineto.json.gz"]),
    "a100_simple_add": (["pytorch/a100_simple_add"], ["pytorch/a100_simple_add/kineto.json.gz"]),
    "rtx2080_linear": (["pytorch/rtx2080_linear"], []),
    "v100_dlrm_8rank": (["pytorch/v100_dlrm_8rank"], ["pytorch/v100_dlrm_8rank/worker*"]),
    "sampled_pair": (["kineto_only/sampled_rank-0.json.gz", "kineto_only/sampled_rank-1.json.gz"],
                     ["kineto_only/sampled_rank-0.json.gz", "kineto_only/sampled_rank-1.json.gz"]),
    "b200_eager_rank0": (["kineto_only/b200_eager_rank0.json.gz"],
                         ["kineto_only/b200_eager_rank0.json.gz"]),
    "vllm_capture": (["vllm/mi300x_decode_full/graph_capture_rank_0.pt.trace.json.gz"], []),
    "vllm_execution": (["vllm/mi300x_decode_full/graph_execution.json.gz"], []),
    "tpu_inference_2": (["jax_xla/tpu_inference_2.xplane.pb"], []),
    "mi300x_jax_conv": (["jax_xla/mi300x_jax_conv.xplane.pb"], []),
}
COMM_TYPES = {5, 6, 7}  # COMM_SEND, COMM_RECV, COMM_COLL


def _tool(name: str, *args: str) -> str:
    run = subprocess.run([PY, str(TOOLS / name), *args], capture_output=True, text=True,
                         timeout=1800)
    if run.returncode:
        raise SystemExit(f"{name} failed: {run.stderr.strip()[-300:]}")
    return run.stdout


def edges_late(nodes) -> tuple[int, int, int]:
    """(edges, edges whose parent ends > 1 us after the child starts, worst us): the same
    count as edges-against-time.py, on the written microseconds."""
    by = {n.id: n for n in nodes}
    total = late = worst = 0
    for n in nodes:
        for d in set(list(n.ctrl_deps) + list(n.data_deps)):
            q = by.get(d)
            if q is None or not (q.duration_micros or q.start_time_micros) or not n.start_time_micros:
                continue
            total += 1
            lateness = q.start_time_micros + q.duration_micros - n.start_time_micros
            if lateness > 1:
                late += 1
                worst = max(worst, lateness)
    return total, late, worst


def exposed_comm_us(nodes) -> float:
    """Device communication that no other device op (kernel, copy) overlaps, from the ET."""
    comm, other = [], []
    for n in nodes:
        a = attr_dict(n)
        if n.name == "host_gap" or ("is_cpu_op" in a and value_of(a["is_cpu_op"])):
            continue
        if "host_side" in a or "host_side_collective" in a:
            continue
        start, dur = node_times(n, a)
        if start is None or not dur:
            continue
        (comm if n.type in COMM_TYPES else other).append((start, start + dur))
    return _length(_minus(_union(comm), _union(other)))


def _union(spans):
    out = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _minus(a, b):
    out, j = [], 0
    for lo, hi in a:
        cur = lo
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def _length(spans) -> float:
    return sum(hi - lo for lo, hi in spans)


def corpus_table(corpus: Path, names: list[str], astra: str | None) -> None:
    print("trace / rank | edges late ours / checker (worst us) | path / span | idle host: "
          "explained / unexplained ms | idle device: explained / unexplained ms | exposed comm "
          "ms ET / Kineto | zero comm wins ms ours / checker")
    for name in names:
        inputs, kineto = TRACES[name]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "full"
            convert_paths([corpus / i for i in inputs], out, progress=False, warn=lambda _: None)
            ets = sorted(out.glob("*.et"), key=lambda p: int(p.name.split(".")[-2]))
            checker_late = [re.search(r": (\d+) of \d+ edges.*worst ([\d.]+) us", line).groups()
                            for line in _tool("edges-against-time.py", *map(str, ets)).splitlines()]
            kin = []
            for pattern in kineto:
                kin.extend(sorted(corpus.glob(pattern)))
            kineto_exposed = {}
            for path in kin:
                for line in _tool("exposed-comm.py", str(path)).splitlines():
                    found = re.search(r"exposed comm ([\d.]+) ms", line)
                    if found:
                        kineto_exposed[path] = float(found.group(1))
            for i, et in enumerate(ets):
                nodes = etio.read_et(et).nodes
                total, late, worst = edges_late(nodes)
                st = rank_stats(str(et), nodes)
                zero = whatif.replay(str(et), nodes, whatif.Change(comm=0.0))
                lo, hi, path_us, zero_us = map(float, _tool("et_paths.py", "zero", str(et)).split())
                exposed = exposed_comm_us(nodes)
                kin_exp = (f"{list(kineto_exposed.values())[i]:.3f}"
                           if len(kineto_exposed) == len(ets) else "-")
                h, d = st.idle_us.get("host", {}), st.idle_us.get("device", {})
                print(f"{name} r{i} | {late} / {checker_late[i][0]} of {total} "
                      f"({worst} / {checker_late[i][1]}) | {st.critical_path_us / st.span_us:.2%} "
                      f"(checker {path_us / (hi - lo):.2%}) | "
                      f"{h.get('explained', 0) / 1e3:,.1f} / {h.get('unexplained', 0) / 1e3:,.1f} | "
                      f"{d.get('explained', 0) / 1e3:,.1f} / {d.get('unexplained', 0) / 1e3:,.1f} | "
                      f"{exposed / 1e3:,.3f} / {kin_exp} | "
                      f"{(zero.replayed_us - zero.predicted_us) / 1e3:,.3f} / "
                      f"{(path_us - zero_us) / 1e3:,.3f}", flush=True)
            peer_row(name, out, kin)
            if astra:
                astra_rows(name, corpus, inputs, Path(tmp), astra)


def peer_row(name: str, out: Path, kineto: list[Path]) -> None:
    """The run's ranks together (converter/peers.py): per rank the peer-wait share of its
    collectives' time (and peer-wait.py's from the raw Kineto files, where the run has every
    rank's), the transfer, the straggler and S, and whatif --comm 0.25x / 0 over the run."""
    from chakra_hooks.converter import peers as run_peers
    from chakra_hooks.converter import run_model

    ranks, groups, world = run_model.read_run(sorted(out.glob("*.et")))
    found = run_peers.analyse(ranks, groups, world)
    if not found.wait_us and not found.unknown:
        return
    theirs = []
    if len(kineto) == len(ranks) > 1:
        text = _tool("peer-wait.py", *map(str, kineto))
        theirs = [float(m) for m in re.findall(r"peer wait share ([\d.]+)", text)]
    cells = []
    per_rank = found.by_rank()
    for i, r in enumerate(ranks):
        mine = per_rank.get(r.rank, run_peers.RankPeers())
        wait, moved = sum(mine.wait_us.values()), sum(mine.transfer_us.values())
        unknown = mine.unknown
        checker = f" (checker {theirs[i]:.1%})" if theirs else ""
        if wait + moved:
            cells.append(f"r{r.rank} {wait / (wait + moved):.1%}{checker} transfer "
                         f"{moved / 1e3:,.3f} ms" + (f", {unknown} unknown" if unknown else ""))
        else:  # no member of its groups recorded them all
            cells.append(f"r{r.rank} unknown for its {unknown}{checker}")
    late = whatif.straggler(ranks, found) if found.columns and len(ranks) > 1 else None
    runs = [whatif.replay_run(ranks, whatif.Change(comm=f), peers=found) for f in (0.25, 0.0)]
    print(f"  peers {name}: peer wait share " + "; ".join(cells)
          + (f" | straggler r{late.rank}, S = {late.slowdown:.3f}" if late and late.rank is not None
             else "") + " | run whatif --comm 0.25x "
          f"{runs[0].predicted_us / runs[0].replayed_us - 1:+.1%}, --comm 0 "
          f"{runs[1].predicted_us / runs[1].replayed_us - 1:+.1%}", flush=True)


def astra_rows(name: str, corpus: Path, inputs: list[str], tmp: Path, astra: str) -> None:
    out = tmp / "astra"
    convert_paths([corpus / i for i in inputs], out, target="astra-sim", progress=False,
                  warn=lambda _: None)
    spans = [rank_stats(str(et), etio.read_et(et).nodes).span_us for et in out.glob("*.et")]
    span = max(spans)
    network, system = out / "astra_network.yml", str(out / "astra_system.json")
    cells = []
    for label, env in (("fitted", {"NETWORK_CONFIG": str(network)}),
                       ("bw x4", {"NETWORK_CONFIG": str(_scaled(network, 4.0, tmp))}),
                       ("bw /4", {"NETWORK_CONFIG": str(_scaled(network, 0.25, tmp))}),
                       ("defaults", {}),
                       ("1e6 GB/s", {"BANDWIDTH": "1000000", "LATENCY": "1"})):
        if "NETWORK_CONFIG" in env:
            env["SYSTEM_CONFIG"] = system
        finish = run_astra(out, astra, env)
        cells.append(f"{label} {finish / 1e3:,.3f} ms ({finish / span:.2f})" if finish else
                     f"{label} FAILED")
    print(f"  astra-sim {name} (span {span / 1e3:,.3f} ms): " + "; ".join(cells), flush=True)


def _scaled(network: Path, factor: float, tmp: Path) -> Path:
    text = network.read_text()
    bw = float(re.search(r"bandwidth: \[ ([\d.e+-]+) \]", text).group(1))
    path = tmp / f"net_{factor}.yml"
    path.write_text(re.sub(r"bandwidth: \[ [\d.e+-]+ \]", f"bandwidth: [ {bw * factor} ]", text))
    return path


def run_astra(out: Path, astra: str, extra: dict) -> float | None:
    """ASTRA-sim's finish (us, the slowest NPU) of the ETs in ``out``, every node executed."""
    ranks = len(list(out.glob("chakra.*.et")))
    env = dict(os.environ, ASTRA_BIN=astra, **extra)
    if (out / "comm_group.json").exists():
        env["COMM_GROUP_CONFIG"] = str(out / "comm_group.json")
    if "NETWORK_CONFIG" in env and ranks < 2:
        text = Path(env["NETWORK_CONFIG"]).read_text()
        patched = out.parent / "net_2npu.yml"
        patched.write_text(re.sub(r"npus_count: \[ \d+ \]", "npus_count: [ 2 ]", text))
        env["NETWORK_CONFIG"] = str(patched)
    run = subprocess.run([str(TOOLS / "astra-run"), str(out / "chakra"), str(max(ranks, 1))],
                         capture_output=True, text=True, env=env, timeout=1800)
    found = re.search(r"RESULT: OK npus=\d+ max_finish_cycles=(\d+)", run.stdout)
    return int(found.group(1)) / 1e3 if found else None


def pair_table(tmp: Path) -> None:
    print("\nground truth: examples/comm_volume.py, 2 gloo ranks; A's ETs with B's measured "
          "collective times vs B's measured span (per rank: ours / et_paths.py swap)")
    runs = {}
    for mb in (4, 64, 256):
        capture = tmp / f"run{mb}"
        subprocess.run([PY, str(REPO / "examples" / "comm_volume.py"), str(capture),
                        "--extra-mb", str(mb)], capture_output=True, timeout=600)
        convert_paths([capture], tmp / f"et{mb}", progress=False, warn=lambda _: None)
        runs[mb] = tmp / f"et{mb}"
    for a in runs:
        for b in runs:
            if a == b:
                continue
            checker = [line.split() for line in
                       _tool("et_paths.py", "swap", str(runs[a]), str(runs[b])).splitlines()]
            cells = []
            for rank in (0, 1):
                mine = etio.read_et(runs[a] / f"chakra.{rank}.et").nodes
                theirs = etio.read_et(runs[b] / f"chakra.{rank}.et").nodes
                got = whatif.replay("a", mine, measured_elsewhere=whatif.collective_durations(theirs))
                measured = rank_stats("b", theirs).span_us
                _, pred, span_b = map(float, checker[rank])
                cells.append(f"r{rank} {got.predicted_us / 1e3:,.1f} / {pred / 1e3:,.1f} ms for "
                             f"{measured / 1e3:,.1f} ({got.predicted_us / measured:.2f})")
            print(f"{a:>3} MB -> {b:>3} MB: " + "; ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--astra", help="ASTRA-sim analytical (congestion-unaware) binary")
    ap.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    ap.add_argument("--no-pair", action="store_true", help="skip the ground-truth recordings")
    ap.add_argument("--only", nargs="*", default=list(TRACES), choices=list(TRACES))
    args = ap.parse_args()
    corpus_table(Path(args.corpus), args.only, args.astra)
    if not args.no_pair:
        with tempfile.TemporaryDirectory() as tmp:
            pair_table(Path(tmp))


if __name__ == "__main__":
    main()
