"""Ground truths for ``scale``: the same work per rank recorded on the emulated cluster at 2, 4
and 8 ranks on one bridge, and at 2 and 4 hosts of 2 ranks; the smaller run's ETs scaled
(``scale --dp``) predict the larger run's span, and a 4-rank capture kept on rank 0 alone,
made whole (``scale --world 4``), predicts the full recording's. Medians over the repeats
recorded in one launch; benchmarks/bench_cluster.py --scale prints each with ASTRA-sim beside.

At 8 ranks the testbed is not a ring for small collectives: 8 processes on 2 cores hand the
ring's 14 steps to each other, and an all-reduce takes 28-40 ms whatever its size up to
256 KB (a 64 KB one 2 ms at 2 ranks). Those runs are held to what the testbed is a ring for
(all-reduces of 1 MB and more grow as the ring model says) and, loosely, to their span."""

from __future__ import annotations

import os
import statistics

import pytest

from .net import unavailable
from .run import record
from .truths import KB, Run, scale_plan, scale_ratios, tier_scale_plan, transfer_growth

WHY = unavailable()
if WHY is not None and os.environ.get("CI") == "true":
    raise RuntimeError(f"the emulated cluster cannot be made in CI: {WHY}")
pytestmark = [pytest.mark.skipif(WHY is not None, reason=f"no emulated cluster here: {WHY}"),
              pytest.mark.extended]
REPEATS = 3


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale_flat")
    return {n: record(root / f"w{n}", n, scale_plan(REPEATS)) for n in (2, 4, 8)}


@pytest.fixture(scope="module")
def flat_ratios(flat, tmp_path_factory):
    return scale_ratios(flat, tmp_path_factory.mktemp("scaled"), 2, completed=4)


@pytest.fixture(scope="module")
def tiers(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale_tiers")
    return {n: record(root / f"w{n}", n, tier_scale_plan(REPEATS), per_host=2) for n in (4, 8)}


@pytest.fixture(scope="module")
def relaunch(tmp_path_factory):
    """A second launch of the flat or the two-tier recordings, made only when a median of the
    first falls outside its bound, its repeats pooled with the first's. The testbed drifts
    between launches more than within one: the same dp 2 -> 4 gave 0.960, 1.046 and 1.106 in
    three launches, tier 4 -> 8 1.07 and 1.30, and the 1 MB all-reduce from 2 to 4 hosts grew
    x1.13-1.25 in some launches and x0.97-1.08 in another. ``again(kind)``: the scale ratios;
    ``again.runs(kind)``: the recordings."""
    runs_made: dict[str, dict] = {}
    ratios_made: dict[str, dict[str, list[float]]] = {}

    def runs(kind: str) -> dict:
        if kind not in runs_made:
            root = tmp_path_factory.mktemp(f"again_{kind}")
            if kind == "flat":
                runs_made[kind] = {n: record(root / f"w{n}", n, scale_plan(REPEATS))
                                   for n in (2, 4, 8)}
            else:
                runs_made[kind] = {n: record(root / f"w{n}", n, tier_scale_plan(REPEATS),
                                             per_host=2) for n in (4, 8)}
        return runs_made[kind]

    def again(kind: str) -> dict[str, list[float]]:
        if kind not in ratios_made:
            scaled = tmp_path_factory.mktemp(f"again_{kind}_scaled")
            ratios_made[kind] = (scale_ratios(runs(kind), scaled, 2, completed=4)
                                 if kind == "flat" else scale_ratios(runs(kind), scaled, 4))
        return ratios_made[kind]
    again.runs = runs
    return again


def _within(found: dict[str, list[float]], name: str, bound: float, again=None) -> None:
    """The median of the repeats within ``bound`` of 1; else, with ``again`` (``relaunch``), of
    the repeats of two launches."""
    values = found[name]
    assert len(values) == REPEATS
    middle = statistics.median(values)
    if abs(middle - 1) > bound and again is not None:
        values = values + again()[name]
        middle = statistics.median(values)
    assert abs(middle - 1) <= bound, (f"{name}: predicted / measured {middle:.3f} (each: "
                                      f"{', '.join(f'{v:.3f}' for v in values)}), bound {bound}")


@pytest.mark.parametrize("kind", ["dp", "ddp"])
def test_two_ranks_scaled_to_four(flat_ratios, relaunch, kind):
    """2 -> 4 ranks, data parallel and DDP (quiet: 0.96 and 0.97; one repeat of dp drifts to
    0.92 or 1.02)."""
    _within(flat_ratios, f"{kind} 2 -> 4", 0.10, lambda: relaunch("flat"))


@pytest.mark.parametrize("kind", ["dp", "ddp"])
def test_rank_0_made_whole(flat_ratios, relaunch, kind):
    """A 4-rank capture kept on rank 0 (as Megatron-Bridge keeps one), converted and completed
    to 4 ranks: within 5 % of the full recording (0.990-1.000 here)."""
    _within(flat_ratios, f"{kind} rank 0 of 4 made whole", 0.05, lambda: relaunch("flat"))


def test_ddp_scaled_to_eight(flat_ratios, relaunch):
    """DDP's 1 MB buckets: 2 -> 8 ranks (0.97)."""
    _within(flat_ratios, "ddp 2 -> 8", 0.10, lambda: relaunch("flat"))


@pytest.mark.parametrize("small, large, per_host", [(2, 8, None), (4, 8, 2)])
def test_large_collectives_grow_as_the_ring_model_says(flat, tiers, relaunch, small, large,
                                                       per_host):
    """What the testbed is a ring for at 8 ranks (all-reduces of 1 MB and more; at 512 KB the
    floor below still shows now and then, x1.35 against x1.17 once): their transfer grows from
    the small run to the large one as the model scale uses says (on one bridge x1.60-1.77
    against x1.75; over 2 -> 4 hosts x1.13-1.25 against x1.17-1.20)."""
    kind = "dp" if per_host is None else "tier"

    def grew(runs) -> dict[int, list[tuple[float, float]]]:
        growth: dict[int, list[tuple[float, float]]] = {}
        for i in range(REPEATS):
            for size, measured, model in transfer_growth(Run.read(runs[small][f"{kind}{i}"]),
                                                         Run.read(runs[large][f"{kind}{i}"]),
                                                         1024 * KB):
                growth.setdefault(size, []).append((measured, model))
        return growth

    def apart(pairs) -> bool:
        measured = statistics.median(m for m, _ in pairs)
        return measured != pytest.approx(statistics.median(m for _, m in pairs), rel=0.15)

    growth = grew(flat if per_host is None else tiers)
    assert len(growth) == 2
    if any(apart(pairs) for pairs in growth.values()):  # a launch that drifted: pool another
        for size, pairs in grew(relaunch.runs("flat" if per_host is None else "tiers")).items():
            growth.setdefault(size, []).extend(pairs)
    for size, pairs in growth.items():  # the median of the repeats (one drifted to x1.49 once)
        assert not apart(pairs), (kind, size, pairs)


def test_spans_at_eight_ranks(flat_ratios, tiers, relaunch, tmp_path):
    """Data parallel 2 -> 8 on one bridge: the span comes out short by the small all-reduces'
    floor above (0.83-0.91 here), and no further; 2 -> 4 hosts, modelled over two dimensions
    as ASTRA-sim runs them, 0.97-1.04 (the hierarchical all-reduce grows dimension 1's share
    x1.5 where gloo's flat ring grew x1.13-1.25, and the floor takes some of that back)."""
    _within(flat_ratios, "dp 2 -> 8", 0.25, lambda: relaunch("flat"))
    _within(scale_ratios(tiers, tmp_path, 4), "tier 4 -> 8", 0.10, lambda: relaunch("tiers"))


@pytest.mark.parametrize("phase", ["dp0", "ddp0"])
def test_whatif_and_astra_sim_agree_on_scaled_ets(flat, phase, tmp_path):
    """The 2-rank recording's --target astra-sim conversion scaled to 4 ranks: our replay of
    the scaled ETs (scale's prediction, which whatif reads back) and ASTRA-sim on the same ETs
    within 2 % (0.0-0.9 % here; 1-7 % when transfers were the recorded ones scaled)."""
    import re
    import subprocess
    from pathlib import Path

    from chakra_hooks.convert import convert_paths
    from chakra_hooks.converter.scale import scale_run

    astra_run = Path(__file__).resolve().parents[3] / "shared" / "tools" / "astra-run"
    if not os.environ.get("ASTRA_BIN") or not astra_run.exists():
        pytest.skip("set ASTRA_BIN to ASTRA-sim's analytical binary (../shared/tools/astra-build)")
    converted = tmp_path / "astra"
    convert_paths([flat[2][phase].with_name(phase)], converted, target="astra-sim",
                  progress=False, warn=lambda _: None)
    done = scale_run(converted, tmp_path / "x2", dp=2)
    out = tmp_path / "x2"
    run = subprocess.run([str(astra_run), str(out / "chakra"), "4"], capture_output=True,
                         text=True, timeout=600, env=dict(
                             os.environ, NETWORK_CONFIG=str(out / "astra_network.yml"),
                             SYSTEM_CONFIG=str(out / "astra_system.json")))
    found = re.search(r"RESULT: OK npus=4 max_finish_cycles=(\d+)", run.stdout)
    assert found, run.stdout[-2000:]
    assert int(found.group(1)) / 1e3 == pytest.approx(done.predicted_us, rel=0.02)
