"""Rules across the ranks of a run (converter/targets/astra_sim/run_rules.py), on real converted runs.

Found by running our ETs in ASTRA-sim: uneven collective sizes deadlock it, a comm-group key
"0" or a group naming ranks without a file aborts it.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import etio
from chakra_hooks.converter.attrs import attr_dict, value_of
from chakra_hooks.converter.summary import summarize
from chakra_hooks.converter.targets.astra_sim.run_rules import check_run, collectives


def _run(outdir: Path) -> tuple[dict[int, list], dict[str, list[int]]]:
    run = {int(p.name.split(".")[1]): list(etio.read_et(p).nodes) for p in outdir.glob("chakra.*.et")}
    group_file = outdir / "comm_group.json"
    groups = orjson.loads(group_file.read_bytes()) if group_file.exists() else {}
    return run, groups


@pytest.fixture(scope="module")
def dlrm_full(corpus: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dlrm_full")
    convert_paths([corpus / "pytorch" / "v100_dlrm_8rank"], out, workers=2, progress=False)
    return out


def test_uneven_all_to_all_is_found_in_the_full_output(dlrm_full: Path) -> None:
    problems = check_run(*_run(dlrm_full))
    assert len(problems) == 1 and "collective #3 differs" in problems[0] and "53248" in problems[0]


def test_astra_sim_output_agrees_across_ranks(corpus: Path, dlrm_full: Path, tmp_path: Path) -> None:
    result = convert_paths([corpus / "pytorch" / "v100_dlrm_8rank"], tmp_path, target="astra-sim",
                           workers=2, progress=False)
    run, groups = _run(tmp_path)
    assert check_run(run, groups) == []
    # The summaries, kept up to date as collectives were rewritten, count what the files hold.
    for rank in result.ranks:
        et = etio.read_et(tmp_path / rank.files[0])
        assert rank.summary == summarize(rank.files[0], et.metadata, et.nodes).to_json()
    full, _ = _run(dlrm_full)
    for rank in run:
        ours = [c.size for c in collectives(run[rank])]
        local = [c.size for c in collectives(full[rank])]
        assert ours == [max(column) for column in zip(*(  # the largest member's size
            [c.size for c in collectives(full[r])] for r in full))]
        resized = [c for c in collectives(run[rank]) if "comm_size_local" in attr_dict(c.node)]
        assert [value_of(attr_dict(c.node)["comm_size_local"]) for c in resized] == \
               [size for size, big in zip(local, ours) if size != big]


def test_tpu_groups_naming_absent_chips_fall_back_to_all_ranks(corpus: Path, tmp_path: Path) -> None:
    full = tmp_path / "full"
    convert_paths([corpus / "jax_xla" / "tpu_inference_2.xplane.pb"], full, progress=False)
    run, groups = _run(full)
    assert any("no ET in this run" in p for p in check_run(run, groups))
    sim = tmp_path / "sim"
    warnings: list[str] = []
    convert_paths([corpus / "jax_xla" / "tpu_inference_2.xplane.pb"], sim, target="astra-sim",
                  progress=False, warn=warnings.append)
    run, groups = _run(sim)
    assert check_run(run, groups) == [] and groups == {}
    assert sum("name ranks with no trace" in w for w in warnings) == 1  # one line for all


def test_comm_group_key_zero_is_refused() -> None:
    assert any('key "0"' in p for p in check_run({0: [], 1: []}, {"0": [0, 1]}))


def test_validate_command_checks_the_run(dlrm_full: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "chakra_hooks", "validate", "--target", "astra-sim",
                             "--limit", "0", str(dlrm_full)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "run of 8 ranks: FAILED" in result.stdout and "collective #3 differs" in result.stdout


def test_ranks_whose_windows_do_not_align_pair_up_by_type_and_size(corpus: Path, tmp_path: Path) -> None:
    # The corpus's two sampled ranks of a 128-rank job ran different collectives at the same
    # places (an ALL_REDUCE of 78 MB on one, an ALL_TO_ALL of 11 MB on the other): written as
    # they were, ASTRA-sim waits forever. Those that pair up by type, size and end time stay
    # collectives (an all-reduce of 78 MB, one of 22 MB, two all-gathers of 1 GB), the rest
    # are replayed for their duration, and each rank's collectives run in the order they
    # started.
    kineto = corpus / "kineto_only"
    warnings: list[str] = []
    out = tmp_path / "astra"
    convert_paths([kineto / "sampled_rank-0.json.gz", kineto / "sampled_rank-1.json.gz"], out,
                  target="astra-sim", progress=False, warn=warnings.append)
    run = {rank: etio.read_et(out / f"chakra.{rank}.et").nodes for rank in (0, 1)}
    assert check_run(run, {}) == []
    paired = {rank: [(c.comm_type, c.size) for c in collectives(nodes)] for rank, nodes in run.items()}
    assert paired[0] == paired[1] == [(0, 78473228), (0, 22866616), (2, 2**30), (2, 2**30)] or \
        paired[0] == paired[1] == [(0, 78473228), (2, 2**30), (0, 22866616), (2, 2**30)]
    for nodes in run.values():
        reasons = [attr_dict(n).get("replayed_as_compute") for n in nodes]
        replayed = [r for r in reasons if r is not None
                    and value_of(r).startswith("no matching collective")]
        assert len(replayed) == 6
        chain = collectives(nodes)
        assert all(a.node.id in b.node.ctrl_deps for a, b in zip(chain, chain[1:]))
    assert any("4 pair up by type, size and end time" in w for w in warnings)

