"""Ranks that wait for each other (converter/peers.py, whatif.replay_run): collectives matched
across ranks and split into peer wait and transfer, checked against ../shared/tools/
peer-wait.py on the raw Kineto files; clocks put on one base; the run replayed together."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from chakra_hooks.cli import cli
from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import peers as run_peers
from chakra_hooks.converter import run_model
from chakra_hooks.converter import whatif

PEER_WAIT = Path(__file__).resolve().parents[3] / "shared" / "tools" / "peer-wait.py"
DLRM = "pytorch/v100_dlrm_8rank"


@pytest.fixture(scope="module")
def dlrm(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("dlrm")
    convert_paths([corpus / DLRM], out, progress=False, warn=lambda _: None)
    return out


def _run(folder: Path):
    ranks, groups, world = run_model.read_run(sorted(folder.glob("*.et")))
    return ranks, run_peers.analyse(ranks, groups, world)


def _per_rank(peers: run_peers.Peers, table: dict) -> dict[int, float]:
    out: dict[int, float] = {}
    for (rank, _), value in table.items():
        out[rank] = out.get(rank, 0.0) + value
    return out


def test_dlrm_peer_wait_agrees_with_the_checker(corpus, dlrm):
    """88-98 % of every rank's NCCL time is waiting for the last peer; the transfer is the same
    ~210 us everywhere. Our split, from the ETs, against the checker's, from raw Kineto."""
    if not PEER_WAIT.exists():
        pytest.skip("../shared/tools/peer-wait.py not found")
    files = [str(next((corpus / DLRM).glob(f"worker{r}_*"))) for r in range(8)]
    text = subprocess.run([sys.executable, str(PEER_WAIT), *files], capture_output=True,
                          text=True, check=True).stdout
    theirs = [float(m) for m in re.findall(r"peer wait ([\d.]+) us", text)]
    assert len(theirs) == 8
    ranks, peers = _run(dlrm)
    assert len(peers.columns) == 8 and not peers.unknown
    ours = _per_rank(peers, peers.wait_us)
    for rank, expected in enumerate(theirs):
        assert ours[rank] == pytest.approx(expected, rel=0.10), (rank, ours, theirs)
    transfer = _per_rank(peers, peers.transfer_us)
    assert all(190 < t < 240 for t in transfer.values()), transfer


def test_dlrm_faster_network_moves_the_run_little(dlrm):
    """Before: --comm 0.25x predicted the run 26 % faster, as if the waits were network time."""
    ranks, peers = _run(dlrm)
    same = whatif.replay_run(ranks, peers=peers)
    assert same.replayed_us == pytest.approx(same.span_us, rel=0.01)
    faster = whatif.replay_run(ranks, whatif.Change(comm=0.25), peers=peers)
    assert 0.97 <= faster.predicted_us / faster.replayed_us <= 1.0
    # Each rank's own replay, waits scaled as network time, is what the run replay replaces.
    alone = max(whatif.replay(r.path, r, whatif.Change(comm=0.25)).predicted_us
                for r in ranks)
    assert alone < 0.85 * faster.predicted_us


def test_a_rank_clock_off_by_5_ms_gives_the_same_model(dlrm):
    ranks, peers = _run(dlrm)
    shifted = [r.retimed(5000.0) if r.rank == 3 else r for r in ranks]
    moved = run_peers.analyse(shifted)
    assert moved.offsets_us[3] - statistics_median(moved.offsets_us) == pytest.approx(5000, abs=50)
    assert any("clocks disagree" in n for n in moved.notes)
    for rank, wait in _per_rank(peers, peers.wait_us).items():
        assert _per_rank(moved, moved.wait_us)[rank] == pytest.approx(wait, rel=0.02, abs=20)
    for change in (whatif.Change(), whatif.Change(comm=0.25), whatif.Change(compute=0.5)):
        before = whatif.replay_run(ranks, change, peers=peers).predicted_us
        after = whatif.replay_run(shifted, change, peers=moved).predicted_us
        assert after == pytest.approx(before, rel=0.02)


def statistics_median(values: dict) -> float:
    import statistics
    return statistics.median(values.values())


def test_ranks_not_all_recorded_keep_the_one_rank_model(corpus, tmp_path):
    """Two ranks of eight: no collective can be matched, so each is its recorded time (waits
    included), said per node and in the counts; the replay is each rank's own."""
    convert_paths([corpus / DLRM / "worker1_step_12.1694128201556.pt.trace.json.gz",
                   corpus / DLRM / "dlrm_eg_1.json.gz",
                   corpus / DLRM / "worker3_step_12.1694128201557.pt.trace.json.gz",
                   corpus / DLRM / "dlrm_eg_3.json.gz"], tmp_path, progress=False,
                  warn=lambda _: None)
    ranks, peers = _run(tmp_path)
    assert [r.rank for r in ranks] == [1, 3]
    assert not peers.columns and len(peers.unknown) == 16
    assert any("16 collectives of 1 process group(s)" in n and "6 of 8 members not recorded" in n
               for n in peers.notes), peers.notes
    run = whatif.replay_run(ranks, whatif.Change(comm=0.25), peers=peers)
    for r, got in zip(ranks, run.ranks):
        alone = whatif.replay(r.path, r, whatif.Change(comm=0.25))
        assert got.predicted_us == pytest.approx(alone.predicted_us, rel=1e-6)


def test_cli_whatif_and_stats_over_the_run(dlrm):
    runner = CliRunner()
    out = runner.invoke(cli, ["whatif", str(dlrm), "--comm", "0.25x", "--ranks", "1", "--json"])
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.output.splitlines()]
    assert len(lines) == 9 and set(lines[-1]) == {"run"}
    run = lines[-1]["run"]
    assert run["matched_collectives"] == 8 and run["predicted_us"] <= run["replayed_us"]
    assert "on rank(s) 1" in run["what_if"]
    bad = runner.invoke(cli, ["whatif", str(dlrm), "--ranks", "9"])
    assert bad.exit_code == 1 and "none of these ranks" in bad.output
    stats = runner.invoke(cli, ["stats", str(dlrm), "--json"])
    assert stats.exit_code == 0, stats.output
    rows = [json.loads(line) for line in stats.output.splitlines()]
    assert rows[1]["peer_wait_us"] == pytest.approx(11125, rel=0.1)
    assert rows[-1]["run"]["straggler"]["rank"] is not None
    text = runner.invoke(cli, ["stats", str(dlrm)]).output
    assert "waiting for peers" in text and "straggler: rank" in text


def test_ranks_of_one_clock_get_no_offset(dlrm):
    """The same 5 ms shift, but the ranks say they share one clock (one machine): no rank is
    moved (the shift is then rank 3 starting late, as a straggler would), and the note about
    ends not lining up, which blames clocks, is not made."""
    ranks, _ = _run(dlrm)
    shifted = [r.retimed(5000.0 if r.rank == 3 else 0.0, host="node0", clock="boot-1")
               for r in ranks]
    found = run_peers.analyse(shifted)
    assert found.offsets_us == {} and not any("clock" in n for n in found.notes), found.notes
    # Two machines of four ranks each: one offset per machine, never per rank.
    split = [r.retimed(0.0 if r.rank < 4 else 5000.0, clock=f"boot-{r.rank // 4}")
             for r in ranks]
    moved = run_peers.analyse(split)
    assert len(set(moved.offsets_us[r] for r in range(4))) == 1
    assert len(set(moved.offsets_us[r] for r in range(4, 8))) == 1
    assert moved.offsets_us[4] - moved.offsets_us[0] == pytest.approx(5000, abs=50)
    assert any("share one" in n for n in moved.notes), moved.notes


def test_comm_from_another_world_size_is_refused(dlrm, corpus, tmp_path):
    two = tmp_path / "two"
    convert_paths([corpus / DLRM / "worker1_step_12.1694128201556.pt.trace.json.gz",
                   corpus / DLRM / "dlrm_eg_1.json.gz"], two, progress=False,
                  warn=lambda _: None)
    ranks, groups, world = run_model.read_run(sorted(dlrm.glob("*.et")))
    with pytest.raises(ValueError, match="a run of 9 rank"):
        whatif.comm_from_problems(ranks, groups, world, ranks, groups, 9, "other")
    with pytest.raises(ValueError, match="process groups"):
        whatif.comm_from_problems(ranks, groups, world, ranks, {**groups, "7": [0, 1]}, world,
                                  "other")
    assert whatif.comm_from_problems(ranks, groups, world, ranks, groups, world, "x") == []
    slower = [r.retimed(duration_factor=1.5) for r in ranks]
    said = whatif.comm_from_problems(ranks, groups, world, slower, groups, world, "other")
    assert len(said) == 1 and "+50.0%" in said[0], said
