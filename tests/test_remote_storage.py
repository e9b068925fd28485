"""`convert` with fsspec URLs as inputs and output: the same bytes as with local folders, all
or nothing, and the driver reading only the heads of the remote traces."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed here (pip install 'chakra-hooks[remote]')")

from chakra_hooks import storage  # noqa: E402
from chakra_hooks.convert import convert_paths  # noqa: E402
from chakra_hooks.common.errors import TraceFormatError  # noqa: E402

DLRM = "pytorch/v100_dlrm_8rank"


def _two_ranks(corpus: Path, folder: Path) -> Path:
    folder.mkdir(parents=True)
    for rank in (0, 1):
        shutil.copy(corpus / DLRM / f"dlrm_eg_{rank}.json.gz", folder)
        shutil.copy(next((corpus / DLRM).glob(f"worker{rank}_step_12.*")), folder)
    return folder


@pytest.fixture
def memory_fs():
    fs = fsspec.filesystem("memory")
    yield fs
    fs.rm("/", recursive=True) if fs.ls("/") else None


def _upload(fs, folder: Path, prefix: str) -> None:
    for path in folder.iterdir():
        fs.pipe(f"{prefix}/{path.name}", path.read_bytes())


@pytest.mark.parametrize("target", ["full", "astra-sim"])
def test_memory_urls_in_and_out_give_the_local_bytes(corpus, tmp_path, memory_fs, target):
    local_in = _two_ranks(corpus, tmp_path / "in")
    expected = convert_paths([local_in], tmp_path / "local", target=target, workers=1,
                             progress=False, warn=lambda _: None)
    _upload(memory_fs, local_in, "/bucket/run")
    result = convert_paths(["memory://bucket/run"], "memory://bucket/out", target=target, workers=1,
                           progress=False, warn=lambda _: None)
    assert [r.rank for r in result.ranks] == [0, 1]
    written = {Path(p).name: memory_fs.cat(p) for p in memory_fs.ls("/bucket/out", detail=False)}
    assert written == {p.name: p.read_bytes() for p in (tmp_path / "local").iterdir()}
    assert [r.summary for r in result.ranks] == [r.summary for r in expected.ranks]
    assert not [p for p in memory_fs.ls("/bucket/out", detail=False)
                if Path(p).name.startswith(storage.STAGING_PREFIX)]


def test_file_urls_with_the_process_pool(corpus, tmp_path):
    local_in = _two_ranks(corpus, tmp_path / "in")
    convert_paths([local_in], tmp_path / "local", workers=2, progress=False, warn=lambda _: None)
    convert_paths([f"file://{local_in}"], f"file://{tmp_path / 'out'}", workers=2, progress=False,
                  warn=lambda _: None)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == \
        {p.name: p.read_bytes() for p in (tmp_path / "local").iterdir()}


def test_a_failed_remote_conversion_leaves_nothing(corpus, tmp_path, memory_fs):
    local_in = _two_ranks(corpus, tmp_path / "in")
    bad = next(local_in.glob("worker1_*"))
    bad.write_bytes(bad.read_bytes()[:20000])
    _upload(memory_fs, local_in, "/bucket/run")
    with pytest.raises(TraceFormatError, match=r"^memory://bucket/run/worker1_step_12\S*: ") as failed:
        convert_paths(["memory://bucket/run"], "memory://bucket/out", workers=1, progress=False,
                      warn=lambda _: None)
    assert "\n" not in str(failed.value)  # one line, naming the file by its URL
    assert not memory_fs.exists("/bucket/out") or not memory_fs.ls("/bucket/out")


def test_a_remote_folder_with_an_earlier_conversion_is_refused(corpus, tmp_path, memory_fs):
    _upload(memory_fs, _two_ranks(corpus, tmp_path / "in"), "/bucket/run")
    memory_fs.pipe("/bucket/out/chakra.0.et", b"earlier")
    memory_fs.pipe("/bucket/out/notes.txt", b"the user's")
    with pytest.raises(TraceFormatError, match="--overwrite"):
        convert_paths(["memory://bucket/run"], "memory://bucket/out", workers=1, progress=False)
    convert_paths(["memory://bucket/run"], "memory://bucket/out", workers=1, progress=False,
                  overwrite=True, warn=lambda _: None)
    names = sorted(Path(p).name for p in memory_fs.ls("/bucket/out", detail=False))
    assert names == ["chakra.0.et", "chakra.1.et", "notes.txt"]
    assert memory_fs.cat("/bucket/out/chakra.0.et") != b"earlier"


def test_the_driver_holds_only_the_heads_of_large_remote_traces(corpus, tmp_path, memory_fs):
    source = corpus / "pytorch" / "rtx2080_linear"
    _upload(memory_fs, source, "/bucket/rtx")
    stand_ins = storage.mirror_inputs(["memory://bucket/rtx"], tmp_path / "heads")
    sizes = {Path(url).name: (local.stat().st_size, size) for local, (url, size) in stand_ins.items()}
    assert sizes["kineto.json.gz"] == (storage.HEAD_BYTES, (source / "kineto.json.gz").stat().st_size)
    assert sizes["host_et.json.gz"][0] == (source / "host_et.json.gz").stat().st_size  # small: whole
    result = convert_paths(["memory://bucket/rtx"], tmp_path / "out", progress=False, warn=lambda _: None)
    assert result.ranks[0].stats["match_rate"] == 1.0  # the worker read the whole trace
