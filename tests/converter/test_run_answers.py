"""Options of the run tools combine as they say: ``--comm`` on top of ``--comm-from`` (it was
dropped), in ``whatif`` and ``timeline`` alike."""

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
