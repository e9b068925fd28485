"""Every reader, fed damaged copies of real corpus files: each case ends in a success or in a
TraceFormatError (the CLI's one-line error, exit 1), never another exception.

Readers: Kineto and host-ET JSON, XSpace protobuf, Chakra ``.et`` files (inspect, validate,
stats), and our own capture's manifests and MoE routing sidecars (a real 2-rank capture of
examples/train_tiny_moe.py). A quick run here (``FUZZ_EXAMPLES`` cases per reader, 25 by
default); ``nox -s fuzz`` runs many more. Mutations: a field of one event or node set to a hostile value (null, text,
negative, huge, NaN, a list, unicode), records dropped or duplicated, the file truncated or a
byte flipped.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from chakra_hooks.convert import convert_paths  # noqa: E402
from chakra_hooks.converter import etio  # noqa: E402
from chakra_hooks.converter.stats import rank_stats  # noqa: E402
from chakra_hooks.converter.validate import validate  # noqa: E402
from chakra_hooks.errors import TraceFormatError  # noqa: E402

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 25,
                suppress_health_check=list(HealthCheck))
HOSTILE = st.sampled_from([None, "x", "", -1, -(10**15), 10**30, 1.5e300, math.nan, math.inf,
                           [], {}, True, "\u00e9\u4e2d\U0001f600", 2**63, [1, 2], {"a": 1}])


def _corpus(rel: str) -> Path:
    path = CORPUS / rel
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return path


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _convert(folder: Path, out: Path) -> None:
    """The property: success, or a one-line TraceFormatError and no output left."""
    try:
        convert_paths([folder], out, progress=False, warn=lambda _: None, overwrite=True)
    except TraceFormatError as exc:
        assert "\n" not in str(exc)
        assert not out.exists() or not any(out.glob("*.et"))


def _mutate_json(doc: dict, key: str, data) -> None:
    records = doc[key]
    action = data.draw(st.sampled_from(["field", "drop", "duplicate", "args"]))
    if not records:
        return
    i = data.draw(st.integers(0, len(records) - 1))
    record = records[i]
    if action == "drop":
        del records[i]
    elif action == "duplicate":
        records.insert(i, json.loads(json.dumps(record)))
    elif isinstance(record, dict):
        target = record.get("args") if action == "args" and isinstance(record.get("args"), dict) \
            else record
        fields = sorted(target) or ["ts"]
        target[data.draw(st.sampled_from(fields))] = data.draw(HOSTILE)


@FUZZ
@given(data=st.data())
def test_kineto_and_et_json(tmp_path_factory, data):
    source = _corpus("pytorch/a100_simple_add")
    folder = tmp_path_factory.mktemp("json")
    kineto, et = _load(source / "kineto.json.gz"), _load(source / "host_et.json.gz")
    which = data.draw(st.sampled_from(["kineto", "et", "base"]))
    if which == "kineto":
        _mutate_json(kineto, "traceEvents", data)
    elif which == "et":
        _mutate_json(et, "nodes", data)
    else:
        kineto["baseTimeNanoseconds"] = data.draw(HOSTILE)
    (folder / "kineto.json").write_text(json.dumps(kineto))
    (folder / "host_et.json").write_text(json.dumps(et))
    _convert(folder, folder / "out")


def _damage_bytes(raw: bytes, data) -> bytes:
    how = data.draw(st.sampled_from(["truncate", "flip"]))
    at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
    if how == "truncate":
        return raw[:at]
    return raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1:]


@pytest.mark.parametrize("rel, name", [("kineto_only/b200_eager_rank0.json.gz", "b200.json"),
                                       ("jax_xla/tpu_inference_2.xplane.pb", "tpu.xplane.pb")])
@FUZZ
@given(data=st.data())
def test_trace_bytes(tmp_path_factory, rel, name, data):
    """A Kineto trace (decompressed: damage inside the JSON) and an XSpace profile."""
    raw = _corpus(rel).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    folder = tmp_path_factory.mktemp("bytes")
    (folder / name).write_bytes(_damage_bytes(raw, data))
    _convert(folder, folder / "out")


@FUZZ
@given(data=st.data())
def test_chakra_et_readers(tmp_path_factory, data):
    """inspect / validate / stats read an .et through etio.read_et."""
    source = _corpus("chakra_reference/chakra.0.et")
    folder = tmp_path_factory.mktemp("et")
    path = folder / "chakra.0.et"
    path.write_bytes(_damage_bytes(source.read_bytes(), data))
    try:
        et = etio.read_et(path)
    except TraceFormatError as exc:
        assert "\n" not in str(exc)
        return
    validate(str(path), et.metadata, et.nodes)
    rank_stats(str(path), et.nodes)


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


def _mutate_tree(value, data):
    """One hostile change somewhere inside a JSON value (a dict, list or scalar)."""
    if isinstance(value, dict) and value:
        key = data.draw(st.sampled_from(sorted(value)))
        if data.draw(st.booleans()):
            value[key] = data.draw(HOSTILE)
        else:
            value[key] = _mutate_tree(value[key], data)
        return value
    if isinstance(value, list) and value:
        i = data.draw(st.integers(0, len(value) - 1))
        action = data.draw(st.sampled_from(["set", "drop", "dig"]))
        if action == "drop":
            del value[i]
        elif action == "set":
            value[i] = data.draw(HOSTILE)
        else:
            value[i] = _mutate_tree(value[i], data)
        return value
    return data.draw(HOSTILE)


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
        path.write_text(json.dumps(_mutate_tree(json.loads(path.read_text()), data)))
    else:
        path.write_bytes(_damage_bytes(path.read_bytes(), data))
    _convert(folder, folder.parent / "out")
