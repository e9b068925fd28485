"""A real 4-rank gloo run of the bundled tiny expert-parallel MoE example under the collector,
converted with ``chakra-hooks convert``: per-rank captures whose collectives agree.

gloo on CPU has all_reduce, all_gather, reduce_scatter (torch 2.13), broadcast, all_to_all /
all_to_all_single and send/recv, so the example uses the real calls (no substitutes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_tiny_moe.py"
CLI = [sys.executable, "-m", "chakra_hooks"]
# The groups train_tiny_moe.py creates with --world-size 4 --ep-size 2.
SCRIPT_GROUPS = {(0, 1, 2, 3), (0, 1), (2, 3), (0, 2), (1, 3)}
WORLD = (0, 1, 2, 3)


def _run(args: list, timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                         cwd=REPO)
    assert out.returncode == 0, f"{args}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    cap = tmp_path_factory.mktemp("run") / "capture"
    _run([sys.executable, EXAMPLE, cap, "--world-size", 4, "--ep-size", 2, "--steps", 5])
    return cap


def _group(groups: dict, node) -> tuple:
    pg = _attr(node, "pg_name")
    return WORLD if not pg else groups[pg]


def _attr(node, name):
    for a in node.attr:
        if a.name == name:
            return getattr(a, a.WhichOneof("value"))
    return None


@pytest.mark.slow
def test_one_capture_per_rank_with_the_window_only(capture):
    man = json.loads((capture / "manifest.json").read_text())
    assert man["complete"] and man["world_size"] == 4 and man["steps"] == [2, 3]
    assert sorted(man["ranks"]) == ["0", "1", "2", "3"]
    assert {tuple(g["ranks"]) for g in man["process_groups"]} == SCRIPT_GROUPS
    per_rank = []
    for r in range(4):
        files = man["ranks"][str(r)]
        assert set(files) == {"host_et", "kineto", "routing"}
        nodes = json.loads((capture / files["host_et"]).read_text())["nodes"]
        names = Counter(n["name"] for n in nodes)
        assert {n for n in names if n.startswith("ProfilerStep#")} == {"ProfilerStep#2",
                                                                     "ProfilerStep#3"}
        per_rank.append({n: c for n, c in names.items() if n.startswith("c10d::")})
        routing = json.loads((capture / files["routing"]).read_text())["records"]
        assert [rec["step"] for rec in routing] == [2, 3]
        for rec in routing:
            assert sum(rec["ep_bins"]) == sum(rec["bins"]) == rec["tokens"] * rec["top_k"]
    assert all(p == per_rank[0] for p in per_rank)
    expected = {"c10d::allreduce_", "c10d::allgather_", "c10d::reduce_scatter_",
                "c10d::broadcast_", "c10d::alltoall_", "c10d::alltoall_base_", "c10d::send",
                "c10d::recv_"}
    assert expected <= set(per_rank[0])


@pytest.mark.slow
def test_converted_ets_agree_across_ranks_and_validate(capture, tmp_path):
    from chakra_hooks.converter.etio import read_et

    out = tmp_path / "et"
    _run(CLI + ["convert", capture, "-o", out])
    ets = sorted(out.glob("chakra.*.et"), key=lambda p: int(p.name.split(".")[1]))
    assert [p.name for p in ets] == [f"chakra.{r}.et" for r in range(4)]
    _run(CLI + ["validate", *ets])
    groups = {k: tuple(v) for k, v in json.loads((out / "comm_group.json").read_text()).items()}
    assert set(groups.values()) == SCRIPT_GROUPS
    colls, sends, recvs = [], {}, {}
    for r, path in enumerate(ets):
        nodes = read_et(path).nodes
        coll = [n for n in nodes if n.type == 7]  # COMM_COLL_NODE
        # all-to-all sizes differ per rank (uneven splits); every other collective agrees.
        # pg_name "" means all ranks (ASTRA-sim's convention); others are comm_group.json keys.
        # Each rank runs its own EP / DP groups' collectives: compare them by group size, and
        # hold every collective to a group the rank belongs to (our collector records the
        # group each call ran on; gloo's c10d ops do not).
        assert all(r in _group(groups, n) for n in coll)
        colls.append(Counter((_attr(n, "comm_type"), len(_group(groups, n)),
                              None if _attr(n, "comm_type") == 6 else _attr(n, "comm_size"))
                             for n in coll))
        # The token exchange runs inside the expert-parallel group: [0, 1] or [2, 3].
        assert {_group(groups, n) for n in coll if _attr(n, "comm_type") == 6} == \
            {(0, 1) if r < 2 else (2, 3)}
        for n in nodes:
            key = (_attr(n, "comm_src"), _attr(n, "comm_dst"), _attr(n, "comm_size"))
            if n.type == 5:
                sends.setdefault(r, []).append(key)
            elif n.type == 6:
                recvs.setdefault(r, []).append(key)
        routing = [n for n in nodes if n.name.startswith("moe_routing:layer")]
        assert len(routing) == 2 and all(len(_attr(n, "moe_expert_tokens").values) == 4
                                         for n in routing)
    assert all(c == colls[0] for c in colls) and sum(colls[0].values()) > 20
    assert {t for t, _, _ in colls[0]} == {0, 2, 5, 6, 7}  # AR, AG, BCAST, A2A, RS
    # Every send has the matching receive on its destination.
    all_sends = sorted(k for v in sends.values() for k in v)
    all_recvs = sorted(k for v in recvs.values() for k in v)
    assert len(all_sends) == 8 and all_sends == all_recvs


@pytest.mark.slow
def test_only_the_chosen_ranks_are_recorded(tmp_path):
    cap = tmp_path / "capture"
    _run([sys.executable, EXAMPLE, cap, "--world-size", 2, "--steps", 4, "--ranks", "1"])
    man = json.loads((cap / "manifest.json").read_text())
    assert man["expected_ranks"] == [1] and sorted(man["ranks"]) == ["1"] and man["complete"]
    assert not list(cap.glob("*rank0*")) and not (cap / "rank-0.manifest.json").exists()


def test_astra_sim_target_run_passes_the_cross_rank_rules(capture, tmp_path):
    """The uneven all_to_all_single of the MoE token exchange differs per rank in the full
    output; the ASTRA-sim output makes each collective agree across its group (ASTRA-sim
    deadlocks otherwise) and validates as a run."""
    out = tmp_path / "sim"
    _run([*CLI, "convert", capture, "-o", out, "--target", "astra-sim"])
    checked = _run([*CLI, "validate", "--target", "astra-sim", out])
    assert "run of 4 ranks: ok" in checked.stdout
    groups = json.loads((out / "comm_group.json").read_text())
    assert "0" not in groups and sorted(map(tuple, groups.values())) == [(0, 1), (0, 2), (1, 3), (2, 3)]


def test_gloo_collectives_last_until_gloo_finished_them_and_each_rank_replays_its_span(capture, tmp_path):
    """gloo's c10d call only queues a collective (~80 us); its ``gloo:<name>`` range on gloo's
    thread runs it, waiting for the peers. The comm op is that range (from where the call
    queued it when gloo started it at once), ending no earlier than the call, and the range
    is no host op of its own (it counted the wait twice: ASTRA-sim replayed this run 1.32x
    long). Every rank's ET then replays to its span (critical path within 1 %)."""
    from chakra_hooks.converter.etio import read_et
    from chakra_hooks.converter.stats import rank_stats

    out = tmp_path / "et"
    _run(CLI + ["convert", capture, "-o", out])
    for path in sorted(out.glob("chakra.*.et")):
        nodes = read_et(path).nodes
        assert not [n for n in nodes if n.name.startswith("gloo:")]
        comm = [n for n in nodes if n.type == 7 and _attr(n, "host_side_collective")]
        waited = [n for n in comm if _attr(n, "queued_duration_ps") is not None]
        assert waited
        for n in waited:  # the run ends no earlier than the call that queued it
            start_ns = _attr(n, "start_ns")
            issued_ns = _attr(n, "issued_ns") or start_ns
            assert start_ns >= issued_ns
            assert start_ns + _attr(n, "duration_ns") >= \
                issued_ns + _attr(n, "queued_duration_ps") // 1000 - 1000
        stats = rank_stats(str(path), nodes)
        assert stats.critical_path_us == pytest.approx(stats.span_us, rel=0.01)


def test_inspect_shows_the_routing_bins(capture, tmp_path):
    out = tmp_path / "et"
    _run(CLI + ["convert", capture, "-o", out])
    shown = json.loads(_run(CLI + ["inspect", "--json", out / "chakra.0.et"]).stdout)
    moe = shown["moe"]
    assert (moe["layers"], moe["steps"], moe["nodes"]) == (1, 2, 2) and moe["tokens"] > 0
    assert moe["max_over_mean"] >= 1.0 and shown["kv"] is None
    assert "MoE" in _run(CLI + ["inspect", out / "chakra.0.et"]).stdout
