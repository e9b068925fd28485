"""Every reader, fed damaged copies of real corpus files: each case ends in a success or in a
TraceFormatError (the CLI's one-line error, exit 1), never another exception.

Readers: Kineto and host-ET JSON, XSpace protobuf and the HLO modules inside it, Chakra ``.et``
files (inspect, validate, stats), and our own capture's manifests and MoE routing sidecars (a
real 2-rank capture of examples/train_tiny_moe.py); HLO text dumps and KV sidecars are fuzzed
beside the captures that make them (tests/jax_xla, tests/vllm_collector). Cases per reader:
``FUZZ_EXAMPLES`` (25 here; ``nox -s fuzz`` runs more). Mutations: a field of one event or node
set to a hostile value (null, text, negative, huge, NaN, a list, unicode), records dropped or
duplicated, the file truncated or a byte flipped.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from fuzz_cases import (FUZZ, HOSTILE, convert_property, damage_bytes,  # noqa: E402
                        mutate_records, mutate_tree, semantic_edit)
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from chakra_hooks.converter import etio  # noqa: E402
from chakra_hooks.converter.stats import rank_stats  # noqa: E402
from chakra_hooks.converter.validate import validate  # noqa: E402
from chakra_hooks.common.errors import TraceFormatError  # noqa: E402

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"


def _corpus(rel: str) -> Path:
    path = CORPUS / rel
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return path


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


@FUZZ
@given(data=st.data())
def test_kineto_and_et_json(tmp_path_factory, data):
    source = _corpus("pytorch/a100_simple_add")
    folder = tmp_path_factory.mktemp("json")
    kineto, et = _load(source / "kineto.json.gz"), _load(source / "host_et.json.gz")
    which = data.draw(st.sampled_from(["kineto", "et", "base"]))
    if which == "kineto":
        mutate_records(kineto["traceEvents"], data)
    elif which == "et":
        mutate_records(et["nodes"], data)
    else:
        kineto["baseTimeNanoseconds"] = data.draw(HOSTILE)
    (folder / "kineto.json").write_text(json.dumps(kineto))
    (folder / "host_et.json").write_text(json.dumps(et))
    convert_property(folder, folder / "out")


@pytest.mark.parametrize("rel, name", [("kineto_only/b200_eager_rank0.json.gz", "b200.json"),
                                       ("jax_xla/tpu_inference_2.xplane.pb", "tpu.xplane.pb"),
                                       ("jax_xla/mi300x_jax_conv.xplane.pb", "gpu.xplane.pb")])
@FUZZ
@given(data=st.data())
def test_trace_bytes(tmp_path_factory, rel, name, data):
    """A Kineto trace (decompressed: damage inside the JSON) and XSpace profiles (TPU; GPU, whose
    device events are read by a loop of their own)."""
    raw = _corpus(rel).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    folder = tmp_path_factory.mktemp("bytes")
    (folder / name).write_bytes(damage_bytes(raw, data))
    convert_property(folder, folder / "out")


@FUZZ
@given(data=st.data())
def test_chakra_et_readers(tmp_path_factory, data):
    """inspect / validate / stats read an .et through etio.read_et."""
    source = _corpus("chakra_reference/chakra.0.et")
    folder = tmp_path_factory.mktemp("et")
    path = folder / "chakra.0.et"
    path.write_bytes(damage_bytes(source.read_bytes(), data))
    try:
        et = etio.read_et(path)
    except TraceFormatError as exc:
        assert "\n" not in str(exc)
        return
    validate(str(path), et.metadata, et.nodes)
    try:  # what no figure can be made of (a duplicate id, a negative duration) is refused
        rank_stats(str(path), et.nodes)
    except TraceFormatError as exc:
        assert "\n" not in str(exc)


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """A real capture of the tiny MoE example (2 gloo ranks, routing bins, manifests)."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("capture") / "run"
    example = Path(__file__).resolve().parents[1] / "examples" / "train_tiny_moe.py"
    subprocess.run([sys.executable, str(example), str(folder)], capture_output=True, timeout=600)
    if not (folder / "manifest.json").exists():
        pytest.fail("the tiny MoE example wrote no capture")
    return folder


@FUZZ
@given(data=st.data())
def test_capture_manifests_and_sidecars(capture, tmp_path_factory, data):
    import shutil

    folder = tmp_path_factory.mktemp("side") / "run"
    shutil.copytree(capture, folder)
    targets = sorted(p.name for p in folder.iterdir()
                     if p.name.endswith("manifest.json") or p.name.startswith("routing."))
    name = data.draw(st.sampled_from(targets))
    path = folder / name
    if data.draw(st.booleans()):
        path.write_text(json.dumps(mutate_tree(json.loads(path.read_text()), data)))
    else:
        path.write_bytes(damage_bytes(path.read_bytes(), data))
    convert_property(folder, folder.parent / "out")


@FUZZ
@given(data=st.data())
def test_hlo_protos_inside_an_xspace(tmp_path_factory, data):
    """A TPU profile whose /host:metadata carries damaged HLO modules (the linker's source of
    shapes, replica groups and operands)."""
    from chakra_hooks.linker.xla import xspace_pb2

    space = xspace_pb2.XSpace()
    space.ParseFromString(_corpus("jax_xla/tpu_inference_2.xplane.pb").read_bytes())
    (meta,) = [p for p in space.planes if p.name == "/host:metadata"]
    (proto_id,) = [k for k, m in meta.stat_metadata.items() if m.name == "Hlo Proto"]
    stats = [st_ for md in meta.event_metadata.values() for st_ in md.stats
             if st_.metadata_id == proto_id]
    stat = stats[data.draw(st.integers(0, len(stats) - 1))]
    stat.bytes_value = damage_bytes(stat.bytes_value, data)
    folder = tmp_path_factory.mktemp("hloproto")
    (folder / "tpu.xplane.pb").write_bytes(space.SerializeToString())
    convert_property(folder, folder / "out")


_CLEAN_WARNINGS: dict[str, set[str]] = {}


def _warnings_of(folder: Path, out: Path) -> set[str]:
    import re

    from chakra_hooks.convert import convert_paths

    said: list[str] = []
    convert_paths([folder], out, progress=False, warn=said.append, overwrite=True)
    return {re.sub(r"\d[\d,.]*", "N", re.sub(r"/\S+", "", w)) for w in said}


@FUZZ
@given(data=st.data())
def test_semantic_edits_are_refused_or_said(tmp_path_factory, reference_reader, data):
    """One thing wrong in a real trace (a time years off, a duration of days, a phase, a
    repeat, correlation ids swapped, device activity or NCCL kernels missing): the convert is
    refused in one line, or every host op and collective of the input is in the ET
    (tests/conservation.py, read with the reference reader), or a warning the clean trace does
    not get says what happened. Never exit 0 after losing ops it did not say."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from conservation import conservation

    source = _corpus("pytorch/v100_dlrm_8rank/worker0_step_12.1694128201545.pt.trace.json.gz")
    if "dlrm" not in _CLEAN_WARNINGS:
        clean = tmp_path_factory.mktemp("clean")
        (clean / "in").mkdir()
        (clean / "in" / "worker0.json").write_bytes(gzip.decompress(source.read_bytes()))
        _CLEAN_WARNINGS["dlrm"] = _warnings_of(clean / "in", clean / "out")
    folder = tmp_path_factory.mktemp("semantic")
    doc = _load(source)
    what = semantic_edit(doc["traceEvents"], data)
    (folder / "in").mkdir()
    trace = folder / "in" / "worker0.json"
    trace.write_text(json.dumps(doc))
    try:
        said = _warnings_of(folder / "in", folder / "out")
    except TraceFormatError as exc:
        assert "\n" not in str(exc)
        assert not any((folder / "out").glob("*.et"))
        return
    _, nodes = reference_reader(folder / "out" / "chakra.0.et")
    try:
        problems = conservation(trace, nodes).problems()
    except (TypeError, KeyError):  # the edit left a value the count cannot read: said?
        problems = ["uncountable"]
    assert not problems or said - _CLEAN_WARNINGS["dlrm"], f"{what}: {problems}, nothing said"


_XSPACE_CLEAN: dict[str, tuple[dict[str, int], set[str]]] = {}


def _xspace_nodes(folder: Path, out: Path) -> tuple[dict[str, int], set[str]]:
    import re

    from chakra_hooks.convert import convert_paths

    said: list[str] = []
    convert_paths([folder], out, progress=False, warn=said.append, overwrite=True)
    counts = {p.name: sum(n.name != "host_gap" for n in etio.read_et(p).nodes)  # ops, not gaps
              for p in sorted(out.glob("*.et"))}
    return counts, {re.sub(r"\d[\d,.]*", "N", re.sub(r"/\S+", "", w)) for w in said}


@pytest.mark.parametrize("name", ["mi300x_jax_conv.xplane.pb", "tpu_inference_2.xplane.pb"])
@FUZZ
@given(data=st.data())
def test_xspace_semantic_edits_are_refused_or_said(tmp_path_factory, name, data):
    """One thing wrong in a real XSpace (a device event repeated, moved by days, lasting
    days, at a negative offset; integer stats as strings): refused in one line, or every
    rank's ET has the original's nodes, or a warning the clean profile does not get says
    what happened."""
    from chakra_hooks.linker.xla import xspace_pb2

    source = _corpus(f"jax_xla/{name}")
    if name not in _XSPACE_CLEAN:
        clean = tmp_path_factory.mktemp("xclean")
        (clean / "in").mkdir()
        shutil.copy(source, clean / "in" / name)
        _XSPACE_CLEAN[name] = _xspace_nodes(clean / "in", clean / "out")
    space = xspace_pb2.XSpace.FromString(source.read_bytes())
    devices = [p for p in space.planes if p.name.startswith("/device:")]
    plane = devices[data.draw(st.integers(0, len(devices) - 1))]
    lines = [line for line in plane.lines if len(line.events)]
    line = lines[data.draw(st.integers(0, len(lines) - 1))]
    event = line.events[data.draw(st.integers(0, len(line.events) - 1))]
    edit = data.draw(st.sampled_from(["repeat", "moved", "long", "negative", "strings"]))
    if edit == "repeat":
        line.events.add().CopyFrom(event)
    elif edit == "moved":
        event.offset_ps += data.draw(st.sampled_from([10**17, 10**18, 2**61]))
    elif edit == "long":
        event.duration_ps = data.draw(st.sampled_from([10**17, 10**18, 2**62]))
    elif edit == "negative":
        event.offset_ps = -data.draw(st.sampled_from([1, 10**9, 10**15]))
    else:
        for stat in event.stats:
            kind = stat.WhichOneof("value")
            if kind in ("int64_value", "uint64_value"):
                stat.str_value = str(getattr(stat, kind))
    folder = tmp_path_factory.mktemp("xsemantic")
    (folder / "in").mkdir()
    (folder / "in" / name).write_bytes(space.SerializeToString())
    try:
        counts, said = _xspace_nodes(folder / "in", folder / "out")
    except TraceFormatError as exc:
        assert "\n" not in str(exc)
        return
    clean_counts, clean_said = _XSPACE_CLEAN[name]
    assert counts == clean_counts or said - clean_said, \
        f"{edit} on {plane.name} {line.name}: {clean_counts} -> {counts}, nothing said"
