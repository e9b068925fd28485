"""Reading a trace file whole (linker/jsonio.py): mapped when plain, inflated when gzipped."""

from __future__ import annotations

import gzip
import mmap
from pathlib import Path

import pytest

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.convert import convert_paths
from chakra_hooks.linker.jsonio import map_bytes, read_bytes

TEXT = b'{"traceEvents": []}'


def test_a_plain_file_is_mapped_and_a_gzipped_one_inflated(tmp_path: Path) -> None:
    plain = tmp_path / "trace.json"
    plain.write_bytes(TEXT)
    mapped = map_bytes(plain)
    assert isinstance(mapped, mmap.mmap) and mapped[:] == TEXT == read_bytes(plain)
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(TEXT))
    assert map_bytes(packed) == TEXT == read_bytes(packed)


def test_what_cannot_be_mapped_is_read(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    assert map_bytes(empty) == b""  # mmap refuses an empty file
    with pytest.raises(TraceFormatError, match="open") as info:
        map_bytes(tmp_path / "missing.json")
    assert str(tmp_path / "missing.json") in str(info.value)
    with pytest.raises(TraceFormatError, match="a readable file"):
        map_bytes(tmp_path)  # a folder


def test_mapped_and_read_traces_convert_alike(corpus: Path, tmp_path: Path,
                                              monkeypatch) -> None:
    """The collectors write plain JSON, which the readers map (the corpus is gzipped, so only
    this test and the collectors' own reach that path): a mapped rank converts to the same
    bytes as the same files read, for an ET with its Kineto trace on one rank and two."""
    from chakra_hooks.linker.pytorch import et, kineto

    mapped: list[bool] = []

    def recording(path: Path) -> object:
        raw = map_bytes(path)
        mapped.append(isinstance(raw, mmap.mmap))
        return raw

    for name in ("pytorch/a100_resnet_nccl", "pytorch/a100_simple_add"):
        plain = tmp_path / "plain" / name
        plain.mkdir(parents=True)
        for packed in (corpus / name).glob("*.json.gz"):
            (plain / packed.name[:-3]).write_bytes(gzip.decompress(packed.read_bytes()))
        outputs = []
        for reader in (recording, read_bytes):
            monkeypatch.setattr(et, "map_bytes", reader)
            monkeypatch.setattr(kineto, "map_bytes", reader)
            out = tmp_path / reader.__name__ / name
            convert_paths([plain], out, workers=1, progress=False)
            outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
        assert outputs[0] and outputs[0] == outputs[1], name
    assert mapped == [True] * 4  # two files a rank, each mapped
