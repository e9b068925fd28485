"""Ground truths where the world changes for real: the same program recorded on the emulated
cluster (tests/cluster/net.py) with one thing changed (the links' rate, the uplinks' rate, one
rank's compute), and one recording's ETs asked to predict the other. Each prediction is the
median over the pairs recorded in one launch (``PAIRS``; ``NOISY_PAIRS`` of the
latency-bound, DDP and two-tier phases). benchmarks/bench_cluster.py
prints every pair and the spread."""

from __future__ import annotations

import os
import statistics

import pytest

from .net import unavailable
from .run import record
from .truths import STRAGGLER, Run, flat_plan, ratios, two_tier_plan

WHY = unavailable()
if WHY is not None and os.environ.get("CI") == "true":  # CI is root: the truths must run there
    raise RuntimeError(f"the emulated cluster cannot be made in CI: {WHY}")
# extended: the two launches take about 3 minutes on 2 cores
pytestmark = [pytest.mark.skipif(WHY is not None, reason=f"no emulated cluster here: {WHY}"),
              pytest.mark.extended]
PAIRS, NOISY_PAIRS = 3, 5
# What a median of pairs is held to. The goal is 5 % (2 % as the aim) and the quiet-machine
# medians are within it (docs/model-time.md); but pairs recorded while the machine's speed
# drifts still moved medians to 0.92-1.12 in 4 of 9 runs of this file, and a red run lands
# nothing. Before the fixes these truths found, they came out at 1.35 (DDP), 1.13 (network).
BOUND = 0.15


@pytest.fixture(scope="module")
def flat(tmp_path_factory) -> dict[str, Run]:
    found = record(tmp_path_factory.mktemp("flat"), 4, flat_plan(PAIRS, NOISY_PAIRS))
    return {name: Run.read(folder) for name, folder in found.items()}


@pytest.fixture(scope="module")
def two_tier(tmp_path_factory) -> dict[str, Run]:
    found = record(tmp_path_factory.mktemp("tiers"), 4, two_tier_plan(NOISY_PAIRS), per_host=2)
    return {name: Run.read(folder) for name, folder in found.items()}


@pytest.fixture(scope="module")
def flat_ratios(flat) -> dict[str, list[float]]:
    return ratios(flat)


def _within(found: dict[str, list[float]], name: str, bound: float) -> None:
    values = found[name]
    assert len(values) >= PAIRS
    middle = statistics.median(values)
    assert abs(middle - 1) <= bound, (f"{name}: predicted / measured {middle:.3f} (pairs: "
                                      f"{', '.join(f'{v:.3f}' for v in values)}), bound {bound}")


@pytest.mark.parametrize("direction", ["R -> 2R", "2R -> R"])
def test_network_rate_predicted_both_ways(flat_ratios, direction):
    """The links at twice (half) the rate: whatif --bandwidth 2x (0.5x) on the other run."""
    _within(flat_ratios, f"net {direction}", BOUND)


@pytest.mark.parametrize("direction", ["R -> 2R", "2R -> R"])
def test_latency_bound_collectives_barely_move(flat_ratios, direction):
    """Mostly small all-reduces: twice the rate moves them little, and --bandwidth says so
    where a flat --comm 0.5x, which halves them, cannot. Their time here is gloo's hand-offs
    between 4 processes on 2 cores, which drifts with the machine's speed from one phase to
    the next (pairs 0.85-1.06, medians of five 0.93-1.07 over four runs)."""
    _within(flat_ratios, f"small {direction}", BOUND)
    ours = statistics.median(flat_ratios["small R -> 2R"])
    flat_factor = statistics.median(flat_ratios["small R -> 2R, flat --comm 0.5x"])
    assert flat_factor < 0.93 and abs(flat_factor - 1) > abs(ours - 1), (
        f"--comm 0.5x came out at {flat_factor:.3f}, --bandwidth 2x at {ours:.3f}")


@pytest.mark.parametrize("direction", ["R -> 2R", "2R -> R"])
def test_ddp_overlap_predicted(flat_ratios, direction):
    """torch's DDP (buckets all-reduced while backward goes on) at twice (half) the rate."""
    _within(flat_ratios, f"ddp {direction}", BOUND)


@pytest.mark.parametrize("name", ["straggler made even", "straggler made slow"])
def test_straggler_at_four_ranks(flat_ratios, name):
    f"""Rank {STRAGGLER} at twice its compute and at its own: each predicts the other."""
    _within(flat_ratios, name, BOUND)


@pytest.mark.parametrize("direction", ["R -> 2R", "2R -> R"])
def test_two_tier_uplinks(two_tier, direction):
    """Hosts of 2 ranks: each host's uplink at twice (half) the rate, predicted on dimension 1
    (between hosts) only; the links within a host keep theirs."""
    _within(ratios(two_tier), f"tier {direction}", BOUND)


def test_ranks_of_one_machine_keep_one_clock(flat, two_tier):
    """Every recording: the ranks name their host and one clock, and no offset is applied
    (gloo's ring all-reduces do not end at one moment on every member; a straggler is late,
    not skewed)."""
    for name, run in {**flat, **two_tier}.items():
        clocks = {r.clock for r in run.ranks}
        assert len(clocks) == 1 and None not in clocks, (name, clocks)
        assert run.peers.offsets_us == {}, (name, run.peers.offsets_us, run.peers.notes)
    assert {r.host for r in flat["net0_R"].ranks} == {"host0"}
    assert [r.host for r in sorted(two_tier["tier0_R"].ranks, key=lambda r: r.rank)] == [
        "host0", "host0", "host1", "host1"]
