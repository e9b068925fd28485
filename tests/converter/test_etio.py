"""ET reading and writing: byte-identical round trips, the reference reader agrees, bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from chakra_hooks.converter import etio
from chakra_hooks.converter.schema import GlobalMetadata, Node, NodeType
from chakra_hooks.common.errors import TraceFormatError


def corpus_ets(corpus: Path) -> list[Path]:
    ref = corpus / "chakra_reference"
    return [ref / "chakra.0.et", *sorted((ref / "astra_sim_microbench").glob("*.et"))]


def test_corpus_ets_round_trip_byte_for_byte(corpus: Path, tmp_path: Path) -> None:
    for path in corpus_ets(corpus):
        et = etio.read_et(path)
        out = tmp_path / path.name
        etio.write_et(out, et.metadata, et.nodes)
        assert out.read_bytes() == path.read_bytes(), path.name


def test_gzip_input_detected_by_magic_and_gz_output(corpus: Path, tmp_path: Path) -> None:
    source = corpus / "chakra_reference" / "a100_resnet_nccl.ref.et.gz"
    et = etio.read_et(source)
    assert et.compressed and len(et.nodes) == 18050
    out = tmp_path / "copy.0.et.gz"
    etio.write_et(out, et.metadata, et.nodes)
    assert out.read_bytes()[:2] == etio.GZIP_MAGIC
    assert gzip.decompress(out.read_bytes()) == gzip.decompress(source.read_bytes())
    # A gzip stream under a name without .gz is still found by its magic bytes.
    renamed = tmp_path / "renamed.et"
    renamed.write_bytes(source.read_bytes())
    assert len(etio.read_et(renamed).nodes) == 18050


def test_reference_reader_sees_the_same_nodes(corpus: Path, tmp_path: Path, reference_reader) -> None:
    et = etio.read_et(corpus / "chakra_reference" / "chakra.0.et")
    out = tmp_path / "ours.0.et"
    etio.write_et(out, et.metadata, et.nodes)
    ref_metadata, ref_nodes = reference_reader(out)
    assert len(ref_nodes) == len(et.nodes) == 3664
    assert ref_metadata.SerializeToString() == et.metadata.SerializeToString()
    for ours, theirs in zip(et.nodes, ref_nodes):
        assert ours.SerializeToString() == theirs.SerializeToString()


def test_reference_json_twin_matches_our_workload_json(corpus: Path, tmp_path: Path) -> None:
    import orjson

    et = etio.read_et(corpus / "chakra_reference" / "chakra.0.et")
    out = tmp_path / "ours.json"
    etio.write_workload_json(out, et.nodes)
    ours = orjson.loads(out.read_bytes())["workload_graph"]
    theirs = orjson.loads(gzip.decompress((corpus / "chakra_reference" / "chakra.0.json.gz").read_bytes()))
    theirs = theirs["workload_graph"]
    assert [n["Id"] for n in ours] == [n["Id"] for n in theirs]
    for node, a, b in zip(et.nodes, ours, theirs):
        assert (a["NodeType"], a["runtime"], a["is_cpu_op"]) == (b["NodeType"], b.get("runtime", 0), b["is_cpu_op"])
        # The JSON format has one dependency list; ours carries ctrl_deps there too (ASTRA-sim
        # waits on both kinds), the reference tools' JSON only data_deps.
        assert set(a["data_deps"]) == set(b["data_deps"]) | set(node.ctrl_deps)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.fixture
def small_et(tmp_path: Path) -> bytes:
    nodes = [Node(id=i, name=f"n{i}", type=NodeType.Value("COMP_NODE"), duration_micros=1) for i in range(1, 4)]
    path = tmp_path / "small.et"
    etio.write_et(path, GlobalMetadata(version="0.0.4"), nodes)
    return path.read_bytes()


@pytest.mark.parametrize("case, expected", [
    ("empty", "the file is empty"),
    ("truncated", "truncated"),
    ("huge_length", "bytes early"),  # a length no C size holds (the compiled build's is one)
    ("prefix_cut", "length prefix"),
    ("zero_length", "zero length prefix"),
    ("not_an_et", "a Chakra ET, but this is a JSON file"),  # what it is, not where it broke
    ("gzip_cut", "complete gzip file"),
    ("corrupt_node", "node #1 at byte"),
])
def test_bad_input_names_file_and_place(tmp_path: Path, small_et: bytes, case: str, expected: str) -> None:
    data = {
        "empty": b"",
        "truncated": small_et[:-3],
        "huge_length": small_et + b"\xff" * 9 + b"\x01",
        "prefix_cut": small_et + b"\x85",
        "zero_length": small_et + b"\x00",
        "not_an_et": b"{\"schema\": \"1.0.1\", \"nodes\": []}\n" * 3,
        "gzip_cut": gzip.compress(small_et)[:-6],
        "corrupt_node": _corrupt_second_node(small_et),
    }[case]
    path = _write(tmp_path, f"{case}.et", data)
    with pytest.raises(TraceFormatError) as info:
        etio.read_et(path)
    message = str(info.value)
    assert str(path) in message and expected in message and "\n" not in message


def _corrupt_second_node(data: bytes) -> bytes:
    frames = etio.split_frames(data)
    offset = len(frames[0]) + len(frames[1])  # start of node #1
    broken = bytearray(data)
    broken[offset + 1] = 0x0F  # field 1 with wire type 7, which does not exist
    return bytes(broken)


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out.0.et"
    with pytest.raises(ValueError):
        etio.write_et(target, GlobalMetadata(version="x"), [Node(id=1, name="a"), Node()])
    assert list(tmp_path.iterdir()) == []


def test_varint_encoding_matches_protobuf() -> None:
    from google.protobuf.internal.encoder import _VarintBytes

    for value in (0, 1, 127, 128, 300, 16383, 16384, 2**28 - 1, 2**28, 2**31, 2**63 - 1,
                  1716423322446085432, 2**64 - 1):
        assert etio.encode_varint(value) == _VarintBytes(value)


def test_written_files_get_the_usual_mode(tmp_path: Path) -> None:
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    path = tmp_path / "mode.0.et"
    etio.write_et(path, GlobalMetadata(version="0.0.4"), [Node(id=1, name="a")])
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def _bodies(count: int, seed: int) -> list[bytes]:
    """Node bodies of lengths on both sides of each varint size (127/128, 16383/16384...)."""
    import random

    rng = random.Random(seed)
    lengths = [1, 127, 128, 129, 16383, 16384, 2**21 - 1, 2**21]
    return [rng.randbytes(lengths[i // 5] if i % 5 == 0 and i // 5 < len(lengths)
                          else rng.randrange(1, 400))
            for i in range(count)]


@pytest.mark.parametrize("count", [0, 1, 7, etio._FRAME_CHUNK, etio._FRAME_CHUNK * 2 + 3])
def test_framed_stream_is_the_stream_encode_et_writes(count: int) -> None:
    # The compiled build writes a list of node bodies in chunks framed by _framed (in C); plain
    # Python runs the same function on wire.py's writers. Both must be encode_et's bytes.
    metadata = GlobalMetadata(version="0.0.4").SerializeToString()
    bodies = _bodies(count, count)
    expected = b"".join(etio.encode_et(metadata, bodies))
    assert b"".join(etio._framed_stream(metadata, bodies)) == expected
    for lo in range(0, count, etio._FRAME_CHUNK):
        chunk = bodies[lo:lo + etio._FRAME_CHUNK]
        assert bytes(etio._framed(chunk)) == b"".join(etio.encode_et(None, chunk))


def test_framed_stream_leaves_messages_and_empty_bodies_to_encode_et(tmp_path: Path) -> None:
    metadata = GlobalMetadata(version="0.0.4")
    node = Node(id=5, name="a")
    mixed = [b"\x08\x01", node, b"\x08\x02"]
    assert etio._framed(mixed) is None
    assert (b"".join(etio._framed_stream(metadata, mixed))
            == b"".join(etio.encode_et(metadata, mixed)))
    assert etio._framed([b"\x08\x01", b""]) is None
    with pytest.raises(ValueError, match="empty Node message"):
        b"".join(etio._framed_stream(metadata, [b"\x08\x01", b""]))
    # and written whole either way: a list of bodies is the compiled build's framed path
    path = tmp_path / "framed.0.et"
    etio.write_et(path, metadata, [node.SerializeToString(), b"\x08\x02"])
    assert etio.read_et(path).nodes[0] == node


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("change", ["longer", "shorter", "same"])
def test_rewrite_staged_leaves_the_file_a_whole_new_one_would(tmp_path: Path, compressed: bool,
                                                              change: str) -> None:
    # A staged ET is rewritten in place from its first replaced frame (compressed: anew); the
    # file must hold exactly the stream with those frames replaced, whether it grew or shrank.
    path = tmp_path / ("staged.0.et.gz" if compressed else "staged.0.et")
    etio.write_et(path, GlobalMetadata(version="0.0.4"), _bodies(60, 11))
    buf, was_compressed = etio.read_bytes(path)
    assert was_compressed is compressed
    starts = etio.frame_starts(buf, path)
    replaced = []
    for place in (7, 8, 30, 60):  # (60: the last frame; place 0 is the metadata)
        body = etio.frame_body(buf[starts[place]:starts[place + 1]])
        body = {"longer": body + b"\x52\x00" * 70, "shorter": body[:1] + b"\x00",
                "same": body[::-1]}[change]
        replaced.append((place, etio.encode_varint(len(body)) + body))
    expected = b"".join(etio.replace_frames(buf, starts, replaced))
    assert b"".join(etio.rewrite_staged(path, buf, starts, replaced, compressed)) == expected
    assert etio.read_bytes(path) == (expected, compressed)
