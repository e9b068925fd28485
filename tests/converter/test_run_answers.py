"""The run tools' answers agree with each other: ``--comm`` on top of ``--comm-from`` (it was
dropped), in ``whatif`` and ``timeline`` alike; the straggler ``stats`` names is what
``whatif`` finds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest



def _whatif(run: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "chakra_hooks", "whatif", "--json", *args,
                           str(run)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout.splitlines()[-1])["run"]


def test_comm_applies_on_top_of_comm_from(dlrm_converted):
    """The run's own transfers taken with --comm-from change nothing; with --comm 0 on top,
    the prediction is --comm 0's alone (all_reduce=0x likewise), not the recording's."""
    alone = _whatif(dlrm_converted, "--comm", "0x")
    own = _whatif(dlrm_converted, "--comm-from", str(dlrm_converted))
    both = _whatif(dlrm_converted, "--comm-from", str(dlrm_converted), "--comm", "0x")
    assert own["predicted_us"] == pytest.approx(own["replayed_us"], rel=1e-9)
    assert both["predicted_us"] == pytest.approx(alone["predicted_us"], rel=1e-9)
    assert both["predicted_us"] < own["predicted_us"]
    typed = _whatif(dlrm_converted, "--comm-from", str(dlrm_converted), "--comm", "all_reduce=0x")
    assert typed["predicted_us"] == pytest.approx(
        _whatif(dlrm_converted, "--comm", "all_reduce=0x")["predicted_us"], rel=1e-9)


def test_per_rank_json_lines_name_their_rank(dlrm_converted):
    for command in (["stats", "--json"], ["whatif", "--json", "--comm", "0.5x"]):
        done = subprocess.run([sys.executable, "-m", "chakra_hooks", *command, str(dlrm_converted)],
                              capture_output=True, text=True, timeout=300)
        lines = [orjson.loads(line) for line in done.stdout.splitlines()[:-1]]
        assert [line["rank"] for line in lines] == list(range(8)), command
        assert all(line["path"].endswith(f"chakra.{line['rank']}.et") for line in lines)


def test_validate_for_astra_sim_says_a_full_conversion_is_not_one(dlrm_converted):
    done = subprocess.run([sys.executable, "-m", "chakra_hooks", "validate", "--target",
                           "astra-sim", str(dlrm_converted / "chakra.0.et")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    problems = [line for line in done.stdout.splitlines() if line.startswith("  ")]
    assert len(problems) == 1 and "a --target full conversion" in problems[0], done.stdout


def _stats(run: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "chakra_hooks", "stats", "--json", str(run)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout.splitlines()[-1])["run"]


@pytest.fixture(scope="module")
def two_gloo_ranks(gloo_traces, tmp_path_factory) -> Path:
    """A real 2-rank gloo job (tests/linker/torch_gloo_job.py), converted."""
    from chakra_hooks.convert import convert_paths

    root = tmp_path_factory.mktemp("gloo2")
    convert_paths([gloo_traces], root / "et", progress=False, warn=lambda _: None)
    return root / "et"


def test_comm_from_takes_an_astra_sim_conversion_of_the_same_traces(gloo_traces, two_gloo_ranks,
                                                                      tmp_path):
    """--target astra-sim leaves groups of every rank out of comm_group.json and replays
    barriers as compute: still the same program, either way round (+0.0 %)."""
    from chakra_hooks.convert import convert_paths

    convert_paths([gloo_traces], tmp_path / "astra", target="astra-sim", progress=False,
                  warn=lambda _: None)
    for here, there in ((two_gloo_ranks, tmp_path / "astra"), (tmp_path / "astra",
                                                               two_gloo_ranks)):
        run = _whatif(here, "--comm-from", str(there))
        assert run["predicted_us"] == pytest.approx(run["replayed_us"], rel=1e-4), run


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 8])
def test_the_straggler_is_checked_by_the_replay(request, ranks):
    """The straggler is the rank whose compute, brought to the others' median, shortens the
    run most: what stats says each rank tried would gain is what whatif predicts with that
    change (2 ranks too, where 'the median rank' had been the rank itself and the figure came
    from slowing the other), and the straggler is the one that gains most."""
    run = request.getfixturevalue("two_gloo_ranks" if ranks == 2 else "dlrm_converted")
    late = _stats(run)["straggler"]
    shortened = {int(k): v for k, v in late["shortened_us"].items()}
    assert len(shortened) == ranks  # every rank of a small run tried
    compute = {int(k): v for k, v in late["compute_us"].items()}
    best = max(shortened.values())
    assert late["rank"] == (min(r for r, v in shortened.items() if v == best) if best > 0
                            else None)
    checked = 0
    for rank in sorted(compute, key=lambda r: -compute[r])[:2]:
        others = sorted(c for r, c in compute.items() if r != rank)
        target = others[(len(others) - 1) // 2]
        if compute[rank] <= target:
            assert shortened[rank] == 0
            continue
        got = _whatif(run, "--ranks", str(rank), "--compute", f"{target / compute[rank]!r}x")
        assert got["predicted_us"] == pytest.approx(late["replayed_us"] - shortened[rank],
                                                    rel=1e-6)
        checked += 1
    assert checked


def test_timeline_and_whatif_share_one_baseline(dlrm_converted, tmp_path):
    """timeline compares its prediction with the replay as recorded, as whatif does (it
    compared with the rank's recorded critical path: a change of nothing 'moved' the run, and
    --comm 0.25x was -17.2 % in one and -18.1 % in the other)."""
    import re

    def drawn(*args: str) -> dict[int, tuple[float, float, float]]:
        done = subprocess.run([sys.executable, "-m", "chakra_hooks", "timeline",
                               str(dlrm_converted), "-o", str(tmp_path / "t.json.gz"), *args],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        found = re.findall(r"rank (\d+): measured ([\d,.]+) us, replayed ([\d,.]+) us, "
                           r"predicted ([\d,.]+) us", done.stdout)
        return {int(r): tuple(float(v.replace(",", "")) for v in vs) for r, *vs in found}

    lines = subprocess.run([sys.executable, "-m", "chakra_hooks", "whatif", "--json", "--comm",
                            "0.25x", str(dlrm_converted)], capture_output=True, text=True,
                           timeout=300).stdout.splitlines()
    per_rank = {row["rank"]: row for row in map(orjson.loads, lines[:-1])}
    timeline = drawn("--comm", "0.25x")
    assert sorted(timeline) == sorted(per_rank) and len(timeline) == 8
    for rank, (span, replayed, predicted) in timeline.items():
        assert replayed == pytest.approx(per_rank[rank]["replayed_us"], abs=0.001)
        assert predicted == pytest.approx(per_rank[rank]["predicted_us"], abs=0.001)
    for rank, (span, replayed, predicted) in drawn("--comm", "1x").items():
        assert predicted == replayed


def test_no_line_of_stats_is_over_200_characters(dlrm_converted):
    """DLRM's top ops on the path made lines of 251-304 characters: a longer line now goes on,
    indented, after a comma."""
    done = subprocess.run([sys.executable, "-m", "chakra_hooks", "stats", str(dlrm_converted)],
                          capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and max(len(line) for line in lines) <= 200
    assert any(line.startswith("      autograd::") for line in lines)  # a top ops line went on
