"""The run as columns (converter/run_model.py): every node of every rank kept, its time and
dependencies as the ET has them, read the same in one process or several, and a big run's
timeline drawn on the ranks that matter."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from chakra_hooks.converter import etio
from chakra_hooks.converter import peers as run_peers
from chakra_hooks.converter import run_model
from chakra_hooks.converter.attrs import attr_dict
from chakra_hooks.converter.stats import rank_stats
from chakra_hooks.convert import convert_paths

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from tile_dlrm import tile_dlrm  # noqa: E402


@pytest.fixture(scope="module")
def tiled(corpus, tmp_path_factory) -> Path:
    """The corpus DLRM run tiled to 64 ranks (copies of its 8), converted."""
    root = tmp_path_factory.mktemp("tiled")
    convert_paths([tile_dlrm(corpus, root / "in", 64)], root / "out", progress=False,
                  warn=lambda _: None)
    return root / "out"


def test_columns_hold_every_node_its_time_and_dependencies(tiled):
    paths = sorted(tiled.glob("chakra.*.et"), key=lambda p: int(p.name.split(".")[1]))[:8]
    ranks, _, world = run_model.read_run(paths)
    assert world == 64
    for r, path in zip(ranks, paths):
        nodes = etio.read_et(path).nodes
        c = r.columns
        assert list(c.ids) == [n.id for n in nodes]
        known = {n.id for n in nodes}
        for p, node in enumerate(nodes):
            start, dur = run_model.node_times(node, attr_dict(node))
            assert (c.start(p), c.durs[p]) == (start, dur)
            assert c.name(p) == node.name and c.types[p] == node.type
            assert [c.ids[q] for q in c.deps[c.dep_at[p]:c.dep_at[p + 1]]] == [
                d for d in (*node.data_deps, *node.ctrl_deps) if d != node.id and d in known]
        assert set(r.comm) == {n.id for n in nodes if n.type in run_model.COMM_TYPES
                               or "comm_unresolved" in attr_dict(n)}
        # What a node costs here: ~1,450 nodes a rank in a few tens of bytes each.
        held = sum(a.itemsize * len(a) for a in (c.ids, c.types, c.starts, c.durs, c.names,
                                                  c.lanes, c.dep_at, c.deps))
        assert held + len(c.kinds) + len(c.cpu) < 100 * len(nodes)


def test_reading_in_workers_gives_the_same_run(tiled):
    """64 ranks read in 2 worker processes (each with its own table of names, merged) or in
    this one: the same columns and the same stats of every rank."""
    paths = sorted(tiled.glob("chakra.*.et"))
    alone, groups, world = run_model.read_run(paths, workers=1)
    spread, groups2, world2 = run_model.read_run(paths, workers=2)
    assert (groups, world) == (groups2, world2)
    for a, b in zip(alone, spread):
        assert (a.rank, a.path, a.comm) == (b.rank, b.path, b.comm)
        assert [a.columns.name(p) for p in range(len(a.columns))] == [
            b.columns.name(p) for p in range(len(b.columns))]
        assert rank_stats(a.path, a.columns).to_json() == rank_stats(b.path, b.columns).to_json()
    found = run_peers.analyse(spread, groups, world)
    assert len(found.columns) == 8 and not found.unknown  # every collective of all 64 matched


def _timeline(folder: Path, out: Path, *args: str) -> tuple[str, dict]:
    run = subprocess.run([sys.executable, "-m", "chakra_hooks", "timeline", str(folder), "-o",
                          str(out), *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return run.stdout, json.loads(gzip.decompress(out.read_bytes()))


def _ranks_drawn(doc: dict) -> set[int]:
    return {ev["pid"] for ev in doc["traceEvents"] if ev["ph"] == "X" and ev["pid"] < 1_000_000}


def test_a_big_run_draws_the_ranks_that_matter(tiled, tmp_path):
    """Of 64 ranks: the rank most waited for (DLRM's rank 7, whose copies the others wait
    for), the longest and the median span, each said; the rest left out but replayed;
    --show-ranks adds, --every-rank draws them all."""
    said, doc = _timeline(tiled, tmp_path / "big.json.gz", "--comm", "0.5x")
    drawn = _ranks_drawn(doc)
    assert 2 <= len(drawn) <= 3, said
    assert "most waited for" in said and "longest span" in said and "median span" in said, said
    assert f"{64 - len(drawn)} other rank(s) left out" in said
    waited = int(next(line for line in said.splitlines() if "most waited for" in line)
                 .split()[1].rstrip(":"))
    assert waited % 8 == 7
    predicted = {ev["pid"] - 1_000_000 for ev in doc["traceEvents"]
                 if ev["ph"] == "X" and ev["pid"] >= 1_000_000}
    assert predicted == drawn
    said, doc = _timeline(tiled, tmp_path / "more.json.gz", "--show-ranks", "5,40")
    assert _ranks_drawn(doc) == drawn | {5, 40} and "asked for" in said
    said, doc = _timeline(tiled, tmp_path / "all.json.gz", "--every-rank")
    assert _ranks_drawn(doc) == set(range(64)) and "left out" not in said


# ------------------------------------------------------------------ nodes read from frames
# The compiled build reads most nodes' column fields from their frames (run_model._scan_frame)
# after protobuf has parsed the file; what it reads must be what the parsed node says, and
# what it declines (communication nodes, extras, oneofs it does not read) is read from the
# parsed node. Both builds run the scanner here (plain Python reads parsed nodes otherwise).

def _parsed(node) -> tuple:
    """What _scan_frame gives, from the parsed node."""
    from chakra_hooks.converter.attrs import value_of

    attrs = {}
    for a in node.attr:
        if a.name in run_model._READ:
            attrs[a.name] = value_of(a)
    for name in ("duration_unknown", "moe_layer", "tensor_size"):  # read for their presence
        if name in attrs:
            attrs[name] = None
    return (node.id, node.type, node.name, node.start_time_micros, node.duration_micros,
            (*node.data_deps, *node.ctrl_deps), attrs)


def _whole_node(node) -> bool:
    return node.type in run_model.COMM_TYPES or any(
        a.name in run_model._WHOLE_NODE_ATTRS for a in node.attr)


def _check_frames(path: Path) -> tuple[int, int]:
    """(nodes read from their frames, nodes the scanner had to read) of one ET."""
    et = etio.read_et(path, keep_frames=True)
    scanned = plain = 0
    for node, frame in zip(et.nodes, et.frames):
        got = run_model._scan_frame(frame)
        if _whole_node(node):
            assert got is None, (path, node.id)
            continue
        plain += 1
        if got is not None:
            assert got == _parsed(node), (path, node.id)
            scanned += 1
    return scanned, plain


def test_frames_are_read_as_their_parsed_nodes(corpus, dlrm_converted, tmp_path):
    folders = [dlrm_converted]
    for rel, target in (("pytorch/a100_resnet_nccl", "full"),
                        ("jax_xla/tpu_inference_2.xplane.pb", "astra-sim"),
                        ("vllm/mi300x_decode_full/graph_execution.json.gz", "full")):
        out = tmp_path / rel.replace("/", "_") / target
        convert_paths([corpus / rel], out, target=target, progress=False, warn=lambda _: None)
        folders.append(out)
    for folder in folders:
        for path in sorted(folder.glob("*.et")):
            scanned, plain = _check_frames(path)
            assert scanned == plain, path  # every node our writer makes is read so


def test_run_read_from_frames_is_the_run_read_from_nodes(dlrm_converted, monkeypatch):
    paths = sorted(dlrm_converted.glob("chakra.*.et"))
    monkeypatch.setattr(run_model, "_SCAN_FRAMES", True)
    framed = run_model.read_run(paths)[0]
    monkeypatch.setattr(run_model, "_SCAN_FRAMES", False)
    parsed = run_model.read_run(paths)[0]
    assert len(framed) == len(parsed) == 8
    for a, b in zip(framed, parsed):
        ca, cb = a.columns, b.columns
        for name in ("ids", "types", "starts", "durs", "kinds", "names", "lanes", "cpu",
                     "dep_at", "deps"):
            # (as bytes: a start outside time is nan, which equals nothing)
            assert memoryview(getattr(ca, name)).tobytes() == memoryview(
                getattr(cb, name)).tobytes(), (a.path, name)
        assert ca.strings.values == cb.strings.values
        assert a.comm == b.comm and ca.extras == cb.extras and ca.pg_config == cb.pg_config


def _node_frame(draw) -> tuple:
    """A Node as a writer may make it: the fields the columns read, attributes of those names
    and others in any oneof, names repeated; sometimes an unknown field, or a field of another
    wire type, written after it. Returns (parsed node or None where protobuf refuses, frame)."""
    from hypothesis import strategies as st

    from chakra_hooks.converter.schema import AttributeProto, Node
    from chakra_hooks.converter.wire import encode_varint

    node = Node(id=draw(st.integers(0, 2**64 - 1)), name=draw(st.text(max_size=8)),
                type=draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 9, 2**31 - 1, -1])),
                start_time_micros=draw(st.sampled_from([0, 1, 2**40, 2**63 + 5])),
                duration_micros=draw(st.integers(0, 2**64 - 1)))
    node.ctrl_deps.extend(draw(st.lists(st.integers(0, 2**64 - 1), max_size=3)))
    node.data_deps.extend(draw(st.lists(st.integers(0, 2**20), max_size=3)))
    names = sorted(run_model._READ) + ["hlo_op", "x", ""]
    oneofs = [f.name for f in AttributeProto.DESCRIPTOR.fields if f.number >= 3] + [None]
    for _ in range(draw(st.integers(0, 6))):
        attr = AttributeProto(name=draw(st.sampled_from(names)))
        if draw(st.booleans()):
            attr.doc_string = draw(st.text(max_size=3))
        oneof = draw(st.sampled_from(["int64_val", "bool_val", "string_val", "uint64_val",
                                      *oneofs]))
        if oneof is not None:
            field = AttributeProto.DESCRIPTOR.fields_by_name[oneof]
            if field.message_type is not None:  # a *_list: empty, set
                getattr(attr, oneof).SetInParent()
            elif field.type == field.TYPE_BOOL:
                setattr(attr, oneof, draw(st.booleans()))
            elif field.type in (field.TYPE_STRING,):
                setattr(attr, oneof, draw(st.text(max_size=4)))
            elif field.type == field.TYPE_BYTES:
                setattr(attr, oneof, draw(st.binary(max_size=4)))
            elif field.type in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
                setattr(attr, oneof, 1.5)
            elif field.type in (field.TYPE_UINT32, field.TYPE_FIXED32):
                setattr(attr, oneof, draw(st.integers(0, 2**32 - 1)))
            elif field.type in (field.TYPE_UINT64, field.TYPE_FIXED64):
                setattr(attr, oneof, draw(st.integers(0, 2**64 - 1)))
            elif field.type in (field.TYPE_INT32, field.TYPE_SINT32, field.TYPE_SFIXED32):
                setattr(attr, oneof, draw(st.integers(-2**31, 2**31 - 1)))
            else:
                setattr(attr, oneof, draw(st.integers(-2**63, 2**63 - 1)))
        node.attr.append(attr)
    body = node.SerializeToString()
    body += draw(st.sampled_from([b"", b"\x78\x01", b"\x0a\x01x", b"\x08\x07", b"\x32\x00",
                                  b"\x52\x04\x0a\x02ab", b"\x52\x03\x48\x80\x01",
                                  b"\x52\x02\x4a\x00", b"\x30\x05\x38\x06"]))
    frame = encode_varint(len(body)) + body if body else b""
    try:
        parsed = Node.FromString(body)
    except Exception:  # (protobuf's DecodeError) what the file's parse would refuse
        parsed = None
    return parsed, frame


def test_frames_the_scanner_reads_it_reads_as_protobuf():
    pytest.importorskip("hypothesis")
    from fuzz_cases import EXAMPLES
    from hypothesis import given, settings
    from hypothesis import strategies as st

    read = []

    @settings(max_examples=max(400, EXAMPLES), deadline=None, derandomize=EXAMPLES <= 25)
    @given(data=st.data())
    def check(data) -> None:
        parsed, frame = _node_frame(data.draw)
        if parsed is None or not frame:
            return
        got = run_model._scan_frame(frame)
        if _whole_node(parsed):
            assert got is None
        elif got is not None:
            assert got == _parsed(parsed), frame
            read.append(frame)

    check()
    assert len(read) >= 40  # the scanner had nodes it reads among the examples
