"""Finding PyTorch ranks: manifest, distributedInfo.rank, file names; pairing; warnings."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import orjson
import pytest

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.pytorch.discover import discover, rank_from_name


def _files(*dirs: Path) -> list[Path]:
    return sorted(p for d in dirs for p in d.rglob("*") if p.is_file())


def _run(files: list[Path]):
    warnings: list[str] = []
    jobs, claimed = discover(files, warnings.append)
    return jobs, claimed, warnings


@pytest.mark.parametrize("name, rank", [
    ("dlrm_eg_3.json.gz", 3),
    ("worker3_step_12.1694128201557.pt.trace.json.gz", 3),
    ("rank-3.json", 3),
    ("llama_dp0_pp0_tp0_dcp0_ep0_rank5.1767189312000000000.pt.trace.json.gz", 5),
    ("graph_capture_rank_0.pt.trace.json.gz", 0),
    ("host_et.json.gz", None),
    ("kineto.json.gz", None),
])
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_dlrm_eight_ranks_paired(corpus: Path) -> None:
    d = corpus / "pytorch/v100_dlrm_8rank"
    jobs, claimed, warnings = _run(_files(d))
    assert not warnings
    assert [j.rank for j in jobs] == list(range(8)) and claimed == set(_files(d))
    for job in jobs:
        assert job.format == "pytorch"
        assert job.files["host_et"].name == f"dlrm_eg_{job.rank}.json.gz"
        assert job.files["kineto"].name.startswith(f"worker{job.rank}_step_12.")


def test_one_et_one_kineto_in_a_directory_pair(corpus: Path) -> None:
    d = corpus / "pytorch/a100_resnet_nccl"
    jobs, _, warnings = _run(_files(d))
    assert len(jobs) == 1
    assert jobs[0].rank == 0  # distributedInfo.rank of the Kineto file
    # It is rank 0 of 2 (distributedInfo.world_size): rank 1 is reported missing.
    assert len(warnings) == 1 and "1 of 2" in warnings[0]
    assert set(jobs[0].files) == {"host_et", "kineto"}


def test_kineto_only_and_vllm(corpus: Path) -> None:
    # The folder holds two jobs (b200: 8 ranks; sampled: 128): refused as one run.
    with pytest.raises(TraceFormatError, match=r"\(8 ranks\).*\(128 ranks\)"):
        _run(_files(corpus / "kineto_only"))
    jobs, claimed, warnings = _run([f for f in _files(corpus / "kineto_only")
                                    if f.name.startswith("sampled")])
    assert sorted((j.rank, tuple(j.files)) for j in jobs) == [(0, ("kineto",)), (1, ("kineto",))]
    jobs, _, warnings = _run(_files(corpus / "vllm/mi300x_decode_full"))
    assert len(jobs) == 2 and all(set(j.files) == {"kineto"} for j in jobs)


def test_other_files_not_claimed(corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "comm_group.json").write_text('{"0": [0, 1]}')
    files = _files(corpus / "jax_xla") + sorted((corpus / "chakra_reference").rglob("*.et"))
    files.append(tmp_path / "comm_group.json")
    jobs, claimed, warnings = _run(files)
    assert not jobs and not claimed and not warnings


def test_json_files_that_are_no_trace_are_named_with_the_reason(corpus: Path, tmp_path: Path) -> None:
    os.symlink(corpus / "pytorch/v100_dlrm_8rank/dlrm_eg_0.json.gz", tmp_path / "dlrm_eg_0.json.gz")
    (tmp_path / "worker0_step_12.pt.trace.json").write_bytes(b"")  # the profiler died
    (tmp_path / "worker1_step_12.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00 not deflate")
    (tmp_path / "notes.json").write_text('{"lr": 0.1}')
    (tmp_path / "rank-2.manifest.json").write_text('{"framework": "pytorch"}')  # a collector's own
    jobs, _, warnings = _run(_files(tmp_path))
    assert [(j.rank, set(j.files)) for j in jobs] == [(0, {"host_et"})]
    notes, empty, corrupt = sorted(warnings)
    assert notes == (f"{tmp_path / 'notes.json'}: skipped: neither a Kineto trace ('traceEvents') "
                     "nor a PyTorch ET ('schema' and 'nodes') in its first 64 KiB")
    assert empty == f"{tmp_path / 'worker0_step_12.pt.trace.json'}: skipped: the file is empty"
    # zlib's own words follow (they differ between zlib versions)
    assert corrupt.startswith(f"{tmp_path / 'worker1_step_12.pt.trace.json.gz'}: skipped: "
                              "not a valid gzip stream (")


def _link_dlrm(corpus: Path, dst: Path, ranks: range, et: bool = True, kineto: bool = True,
               layout: str = "flat") -> None:
    d = corpus / "pytorch/v100_dlrm_8rank"
    for r in ranks:
        k = Path(glob.glob(str(d / f"worker{r}_step_12.*.pt.trace.json.gz"))[0])
        if layout == "nemo":  # NeMo's PytorchProfilerCallback: host/rank-<r>, device/rank-<r>
            pairs = [(d / f"dlrm_eg_{r}.json.gz", dst / "host" / f"rank-{r}.json.gz", et),
                     (k, dst / "device" / f"rank-{r}.json.gz", kineto)]
        else:
            pairs = [(d / f"dlrm_eg_{r}.json.gz", dst / f"dlrm_eg_{r}.json.gz", et),
                     (k, dst / k.name, kineto)]
        for src, target, wanted in pairs:
            if wanted:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(src, target)


def test_missing_rank_warns(corpus: Path, tmp_path: Path) -> None:
    _link_dlrm(corpus, tmp_path, range(7))
    jobs, _, warnings = _run(_files(tmp_path))
    assert [j.rank for j in jobs] == list(range(7))
    assert len(warnings) == 1 and "1 of 8" in warnings[0] and "7" in warnings[0]


def test_rank_with_only_an_et_is_still_a_job(corpus: Path, tmp_path: Path) -> None:
    _link_dlrm(corpus, tmp_path, range(7))
    _link_dlrm(corpus, tmp_path, range(7, 8), kineto=False)
    jobs, _, warnings = _run(_files(tmp_path))
    assert len(jobs) == 8 and set(jobs[7].files) == {"host_et"}
    assert any("no Kineto trace next to dlrm_eg_7" in w for w in warnings)


def test_nemo_host_device_layout(corpus: Path, tmp_path: Path) -> None:
    _link_dlrm(corpus, tmp_path, range(8), layout="nemo")
    jobs, _, warnings = _run(_files(tmp_path))
    assert not warnings and [j.rank for j in jobs] == list(range(8))
    assert all(j.files["host_et"].parent.name == "host" and
               j.files["kineto"].parent.name == "device" for j in jobs)


def test_manifest_wins(corpus: Path, tmp_path: Path) -> None:
    _link_dlrm(corpus, tmp_path, range(2))
    kineto = sorted(p.name for p in tmp_path.glob("worker*"))
    manifest = {"framework": "pytorch", "world_size": 3, "ranks": {
        "0": {"host_et": "dlrm_eg_0.json.gz", "kineto": kineto[0]},
        # Deliberately swapped: the manifest is believed over names and contents.
        "1": {"host_et": "dlrm_eg_1.json.gz", "kineto": kineto[1], "routing": "routing.json"},
    }}
    (tmp_path / "manifest.json").write_bytes(orjson.dumps(manifest))
    (tmp_path / "rank-0.manifest.json").write_text("{}")
    jobs, claimed, warnings = _run(_files(tmp_path))
    assert [j.rank for j in jobs] == [0, 1]
    assert jobs[1].files["kineto"].name == kineto[1] and "routing" not in jobs[1].files
    assert any("routing.json is missing" in w for w in warnings)
    assert any("1 of 3" in w for w in warnings)  # rank 2 of world 3
    assert tmp_path / "manifest.json" in claimed
    assert tmp_path / "rank-0.manifest.json" in claimed
    assert all(j.options["manifest"].endswith("manifest.json") for j in jobs)


def test_other_framework_manifest_ignored(corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"framework": "jax", "ranks": {}}')
    jobs, claimed, _ = _run(_files(tmp_path))
    assert not jobs and not claimed


def test_traces_the_manifest_does_not_list_are_ignored(corpus: Path, tmp_path: Path) -> None:
    _link_dlrm(corpus, tmp_path, range(4))  # an earlier 4-rank run left its files here
    kineto = sorted(p.name for p in tmp_path.glob("worker*"))
    manifest = {"framework": "pytorch", "world_size": 2, "ranks": {
        str(r): {"host_et": f"dlrm_eg_{r}.json.gz", "kineto": kineto[r]} for r in range(2)}}
    (tmp_path / "manifest.json").write_bytes(orjson.dumps(manifest))
    jobs, claimed, warnings = _run(_files(tmp_path))
    assert [j.rank for j in jobs] == [0, 1]
    assert tmp_path / "dlrm_eg_3.json.gz" in claimed  # claimed, so not converted as rank 3
    assert any("does not list" in w and "dlrm_eg_2.json.gz" in w for w in warnings)
