"""`chakra-hooks timeline` on corpus conversions and on the reference converter's ET: the file
passes a strict check of the Chrome Trace Event format as Perfetto reads it (slices of one
track nest or are disjoint, every flow has both ends inside slices), draws every node the
reference reader finds, and its critical path has the total `stats` prints."""

from __future__ import annotations

import re

import gzip
import json
import math
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from chakra_hooks.converter import etio
from chakra_hooks.converter.peers import analyse
from chakra_hooks.converter.run_model import read_run
from chakra_hooks.converter.stats import rank_stats
from chakra_hooks.converter.whatif import Change, replay_run
from chakra_hooks.convert import convert_paths

METADATA_NAMES = {"process_name", "process_sort_index", "process_labels", "thread_name",
                  "thread_sort_index"}
EPS = 2e-3  # us: times are written rounded to the nanosecond


def _timeline(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chakra_hooks", "timeline", *args],
                          capture_output=True, text=True, timeout=600)


def check_trace_events(doc: dict) -> list[dict]:
    """The Trace Event Format's rules that Perfetto enforces; returns the slices."""
    assert set(doc) >= {"traceEvents"} and isinstance(doc["traceEvents"], list)
    slices, flows = [], defaultdict(list)
    for ev in doc["traceEvents"]:
        ph = ev["ph"]
        assert ph in {"X", "M", "s", "f"}, ev
        assert type(ev["pid"]) is int and type(ev["tid"]) is int, ev
        if ph == "M":
            assert ev["name"] in METADATA_NAMES and isinstance(ev["args"], dict), ev
            continue
        assert isinstance(ev["name"], str) and ev["name"], ev
        assert isinstance(ev["ts"], (int, float)) and math.isfinite(ev["ts"]) and ev["ts"] >= 0
        if ph == "X":
            assert isinstance(ev["dur"], (int, float)) and math.isfinite(ev["dur"])
            assert ev["dur"] >= 0 and isinstance(ev["args"], dict), ev
            slices.append(ev)
        else:
            flows[ev["id"]].append(ev)
    tracks = defaultdict(list)
    for ev in slices:
        tracks[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
    for key, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[float] = []
        for lo, hi in spans:
            while open_ends and open_ends[-1] <= lo + EPS:
                open_ends.pop()
            assert not open_ends or hi <= open_ends[-1] + EPS, f"track {key}: slices cross"
            open_ends.append(hi)
    for fid, ends in flows.items():
        assert sorted(e["ph"] for e in ends) == ["f", "s"], f"flow {fid}: {ends}"
        for end in ends:
            inside = [lo for lo, hi in tracks[(end["pid"], end["tid"])]
                      if lo - EPS <= end["ts"] <= hi + EPS]
            assert inside, f"flow {fid} end outside every slice of its track"
    return slices


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _labels(doc: dict) -> dict[int, str]:
    return {ev["pid"]: ev["args"]["labels"] for ev in doc["traceEvents"]
            if ev["ph"] == "M" and ev["name"] == "process_labels"}


def _tracks(doc: dict) -> dict[tuple[int, int], str]:
    return {(ev["pid"], ev["tid"]): ev["args"]["name"] for ev in doc["traceEvents"]
            if ev["ph"] == "M" and ev["name"] == "thread_name"}


CORPUS_RUNS = [  # every corpus trace, as benchmarks/same_outputs.py converts them
    ["pytorch/a100_resnet_nccl"], ["pytorch/a100_simple_add"], ["pytorch/rtx2080_linear"],
    ["pytorch/v100_dlrm_8rank"],
    ["kineto_only/sampled_rank-0.json.gz", "kineto_only/sampled_rank-1.json.gz"],
    ["kineto_only/b200_eager_rank0.json.gz"],
    ["vllm/mi300x_decode_full/graph_capture_rank_0.pt.trace.json.gz"],
    ["vllm/mi300x_decode_full/graph_execution.json.gz"],
    ["jax_xla/tpu_inference_2.xplane.pb"], ["jax_xla/mi300x_jax_conv.xplane.pb"],
]


@pytest.mark.parametrize("inputs, target", [(run, "full") for run in CORPUS_RUNS]
                         + [(["pytorch/a100_resnet_nccl"], "astra-sim"),
                            (["pytorch/v100_dlrm_8rank"], "astra-sim")],
                         ids=lambda v: v[0].split("/")[-1] if isinstance(v, list) else v)
def test_corpus_timelines(corpus: Path, tmp_path: Path, reference_reader, inputs, target) -> None:
    out = tmp_path / "chakra"
    convert_paths([corpus / i for i in inputs], out, target=target, progress=False)
    result = _timeline([str(out), "-o", str(tmp_path / "run.json.gz")])
    assert result.returncode == 0, result.stderr
    doc = _load(tmp_path / "run.json.gz")
    slices = check_trace_events(doc)
    tracks, labels = _tracks(doc), _labels(doc)
    ets = sorted(out.glob("*.et"), key=lambda p: int(p.name.split(".")[1]))
    assert len(labels) == len(ets)
    for path in ets:
        rank = int(path.name.split(".")[1])
        _, ref_nodes = reference_reader(path)  # counted by mlc-chakra, not by our reader
        drawn = [ev for ev in slices if ev["pid"] == rank
                 and not tracks[(rank, ev["tid"])].startswith("critical path")
                 and "peer_wait_us" not in ev["args"]]
        assert len(drawn) == len(ref_nodes)
        assert Counter(ev["args"]["id"] for ev in drawn) == Counter(n.id for n in ref_nodes)
        stats = rank_stats(str(path), etio.read_et(path).nodes)
        assert f"critical path {stats.critical_path_us:,.3f} us" in labels[rank]
        on_path = sum(ev["dur"] for ev in slices if ev["pid"] == rank
                      and tracks[(rank, ev["tid"])].startswith("critical path"))
        assert on_path == pytest.approx(stats.critical_path_us, abs=1e-3 * len(ref_nodes))
        gaps = [ev for ev in drawn if ev["name"] == "host_gap"]
        # tracks named as Perfetto users name them, the raw lane in each slice's args
        assert not any(re.match(r"(stream|thread|comm|tpu|cpu):", name)
                       for name in tracks.values()), sorted(set(tracks.values()))[:8]
        # a lane's gap track, or one of its sub-tracks ("... gaps (2)")
        assert all(re.sub(r" \(\d+\)$", "", tracks[(rank, ev["tid"])]).endswith(" gaps")
                   for ev in gaps)
    if target == "full" and "dlrm" in inputs[0]:
        flows = [ev for ev in doc["traceEvents"] if ev["ph"] == "s"]
        assert flows  # launches, syncs and collectives cross lanes
        # Each collective's wait for its last peer, apart on "<stream> peer wait" tracks: the
        # 8 x 8 collectives, 1,534-11,125 us per rank (../shared/tools/peer-wait.py).
        waits = [ev for ev in slices if "peer_wait_us" in ev["args"]]
        assert all(tracks[(ev["pid"], ev["tid"])].endswith("peer wait") for ev in waits)
        per_rank = Counter()
        for ev in waits:
            per_rank[ev["pid"]] += ev["dur"]
        assert per_rank[1] == pytest.approx(11125, rel=0.01)
        assert per_rank[7] == pytest.approx(1534, rel=0.01)


def test_reference_et_without_times_is_laid_out_by_replay(corpus: Path, tmp_path: Path,
                                                          reference_reader) -> None:
    et = tmp_path / "ref" / "chakra.0.et"
    et.parent.mkdir()
    shutil.copy(corpus / "chakra_reference" / "chakra.0.et", et)
    result = _timeline([str(et.parent), "-o", str(tmp_path / "ref.json")])
    assert result.returncode == 0, result.stderr
    doc = _load(tmp_path / "ref.json")
    slices = check_trace_events(doc)
    tracks = _tracks(doc)
    _, ref_nodes = reference_reader(et)
    drawn = [ev for ev in slices if not tracks[(ev["pid"], ev["tid"])].startswith("critical")]
    assert len(drawn) == len(ref_nodes) == 3664
    assert "laid out by replay" in _labels(doc)[0]
    stats = rank_stats(str(et), etio.read_et(et).nodes)
    assert f"critical path {stats.critical_path_us:,.3f} us" in _labels(doc)[0]
    stuck = [ev for ev in drawn if tracks[(ev["pid"], ev["tid"])].startswith("never runs")]
    # the reference ET has 383 self-dependencies and a cycle: what a replay never reaches is
    # drawn after the end, and said
    assert len(stuck) == len(ref_nodes) - len(stats_finish(et)) > 0
    assert f"{len(stuck):,} nodes on or behind a dependency cycle" in result.stdout
    ran = [ev for ev in drawn if ev not in stuck]
    assert max(ev["ts"] + ev["dur"] for ev in ran) == pytest.approx(stats.critical_path_us,
                                                                    abs=0.01)


def stats_finish(et: Path) -> dict:
    from chakra_hooks.converter.stats import critical_path

    return critical_path(etio.read_et(et).nodes, {})[0]


def test_what_if_is_drawn_beside_the_recording(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "chakra"
    convert_paths([corpus / "pytorch" / "v100_dlrm_8rank"], out, progress=False)
    result = _timeline([str(out), "-o", str(tmp_path / "w.json"), "--comm", "0.25x"])
    assert result.returncode == 0, result.stderr
    doc = _load(tmp_path / "w.json")
    check_trace_events(doc)
    labels = _labels(doc)
    predicted = {pid - 1_000_000: text for pid, text in labels.items() if pid >= 1_000_000}
    assert sorted(predicted) == list(range(8))
    ranks, groups, world = read_run(sorted(out.glob("*.et")))
    run = replay_run(ranks, Change(comm=0.25), peers=analyse(ranks, groups, world))
    for rank, text in predicted.items():  # as whatif predicts it: the ranks replayed together
        assert f"predicted span {run.ranks[rank].predicted_us:,.3f} us" in text
    names = {ev["args"]["name"] for ev in doc["traceEvents"]
             if ev["ph"] == "M" and ev["name"] == "process_name"}
    assert "rank 1 what-if: communication x0.25" in names
    # A 4x faster network barely moves rank 1: its collectives' time is waiting for peers,
    # whose compute did not change (rank 1 alone, waits scaled too, predicted 13,961.750 us).
    assert run.ranks[1].predicted_us > 0.99 * run.ranks[1].replayed_us
    slices = [ev for ev in doc["traceEvents"] if ev["ph"] == "X" and ev["pid"] >= 1_000_000]
    assert any("peer_wait_us" in ev["args"] for ev in slices)


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    result = _timeline([str(tmp_path / "nothing"), "-o", str(tmp_path / "x.json")])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "x.json").exists()


def test_lane_titles():
    from chakra_hooks.converter.timeline import lane_title

    assert lane_title("stream:2:4") == "stream 4 (device 2)"
    assert lane_title("stream:1:84 peer wait") == "stream 84 (device 1) peer wait"
    assert lane_title("thread:59812 gaps") == "thread 59812 gaps"
    assert lane_title("thread:et3") == "thread 3 (host ET)"
    assert lane_title("comm:default") == "collectives (default group)"
    assert lane_title("tpu:0:XLA Ops") == "XLA Ops (TPU 0)"
    assert lane_title("untimed (metadata)") == "untimed (metadata)"
