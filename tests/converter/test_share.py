"""`chakra-hooks share`: a run's copy that simulates the same and reveals no names.

On every corpus run and on our own recording (the README's main job): `share --check` finds
no word or id of the original inputs in the shared files; `validate` passes; `stats` and
`whatif --comm 0.25x` give the original's figures (names, shapes) or stay within the stated
bound (times); a name put back is caught; the same key gives the same pseudonyms on every
rank and across runs, another key others. ASTRA-sim's finish time is the original's (with
ASTRA_BIN)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chakra_hooks.converter import etio

REPO = Path(__file__).resolve().parents[2]
RUNS = {  # corpus inputs -> what convert reads
    "dlrm": ["pytorch/v100_dlrm_8rank"],
    "resnet": ["pytorch/a100_resnet_nccl"],
    "rtx2080": ["pytorch/rtx2080_linear"],
    "simple_add": ["pytorch/a100_simple_add"],
    "sampled": ["kineto_only/sampled_rank-0.json.gz", "kineto_only/sampled_rank-1.json.gz"],
    "b200": ["kineto_only/b200_eager_rank0.json.gz"],
    "vllm_capture": ["vllm/mi300x_decode_full/graph_capture_rank_0.pt.trace.json.gz"],
    "vllm_execution": ["vllm/mi300x_decode_full/graph_execution.json.gz"],
    "tpu": ["jax_xla/tpu_inference_2.xplane.pb"],
    "mi300x_jax": ["jax_xla/mi300x_jax_conv.xplane.pb"],
}


def _cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chakra_hooks", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _run_json(command: str, folder: Path, *extra: str) -> dict:
    lines = _ok(_cli(command, folder, "--json", *extra)).strip().splitlines()
    return json.loads(lines[-1])["run"]


def _numbers(value):
    """A JSON value with its strings left out (pseudonyms differ from names; figures not)."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items() if not isinstance(v, str)}
    if isinstance(value, list):
        return [_numbers(v) for v in value if not isinstance(v, str)]
    return value


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    from chakra_hooks.converter.share import load_key

    path = tmp_path_factory.mktemp("key") / "share.key"
    load_key(path, lambda _: None, new=True)
    return path


@pytest.mark.parametrize("name", sorted(RUNS))
def test_corpus_runs_share_without_a_leak(corpus, tmp_path, key, name):
    inputs = [corpus / i for i in RUNS[name]]
    out, shared = tmp_path / "out", tmp_path / "shared"
    _ok(_cli("convert", *inputs, "-o", out))
    _ok(_cli("share", out, "-o", shared, "--key-file", key))
    said = _ok(_cli("share", "--check", shared, *inputs))
    assert "none of" in said
    _ok(_cli("validate", shared))
    for command, extra in (("stats", ()), ("whatif", ("--comm", "0.25x"))):
        assert _numbers(_run_json(command, shared, *extra)) == \
            _numbers(_run_json(command, out, *extra)), command
    meta = {a.name: a for a in etio.read_et(sorted(shared.glob("*.et"))[0]).metadata.attr}
    assert meta["share_level"].string_val == "names" and "node names" in \
        meta["share_removed"].string_val
    assert not {"pid", "kineto_file", "source_file", "host_et_file"} & set(meta)


def test_a_name_put_back_is_caught(corpus, tmp_path, key):
    """The leak test itself: an original op name restored in one node, and a thread id in a
    lane, are found and named; exit 1."""
    run = corpus / "pytorch" / "a100_resnet_nccl"
    out, shared = tmp_path / "out", tmp_path / "shared"
    _ok(_cli("convert", run, "-o", out))
    _ok(_cli("share", out, "-o", shared, "--key-file", key))
    original = etio.read_et(out / "chakra.0.et")
    et = etio.read_et(shared / "chakra.0.et")
    name = next(n.name for n in original.nodes if n.name == "aten::batch_norm")
    et.nodes[10].name = name
    etio.write_et(shared / "chakra.0.et", et.metadata, et.nodes)
    found = _cli("share", "--check", shared, run)
    assert found.returncode == 1 and "'batch_norm'" in found.stdout, found.stdout
    assert "leak:" in found.stdout and "chakra.0.et" in found.stdout


def test_levels_and_keys(corpus, tmp_path, key):
    """Shapes rounded up to powers of two; durations within the bound, and whatif within it;
    the same key: the same pseudonyms on every rank and in a second share; another key:
    others."""
    from chakra_hooks.converter.share import _power_of_two

    run = corpus / "pytorch" / "v100_dlrm_8rank"
    out = tmp_path / "out"
    _ok(_cli("convert", run, "-o", out))
    for level, extra in (("names", ()), ("shapes", ()), ("times", ("--bound", "0.05"))):
        _ok(_cli("share", out, "-o", tmp_path / level, "--key-file", key, "--level", level,
                 *extra))
    _ok(_cli("share", out, "-o", tmp_path / "again", "--key-file", key))
    _ok(_cli("share", out, "-o", tmp_path / "other", "--key-file", tmp_path / "other.key",
             "--new-key"))
    before = etio.read_et(out / "chakra.0.et").nodes
    names = {n.id: n for n in etio.read_et(tmp_path / "names" / "chakra.0.et").nodes}
    again = {n.id: n for n in etio.read_et(tmp_path / "again" / "chakra.0.et").nodes}
    other = {n.id: n for n in etio.read_et(tmp_path / "other" / "chakra.0.et").nodes}
    shapes = {n.id: n for n in etio.read_et(tmp_path / "shapes" / "chakra.0.et").nodes}
    times = {n.id: n for n in etio.read_et(tmp_path / "times" / "chakra.0.et").nodes}
    shared1 = etio.read_et(tmp_path / "names" / "chakra.1.et").nodes
    pseudonym = {n.name: names[n.id].name for n in before}
    for original, shared in zip(etio.read_et(out / "chakra.1.et").nodes, shared1):
        if original.name in pseudonym:  # one name, one pseudonym, on every rank
            assert shared.name == pseudonym[original.name]
    for n in before:
        assert names[n.id].name == again[n.id].name
        if n.name != "host_gap":
            assert names[n.id].name != other[n.id].name and names[n.id].name != n.name
        if n.inputs.shapes:
            dims = [d for shape in json.loads(n.inputs.shapes) if isinstance(shape, list)
                    for d in shape if isinstance(d, int)]
            got = [d for shape in json.loads(shapes[n.id].inputs.shapes)
                   if isinstance(shape, list) for d in shape if isinstance(d, int)]
            assert got == [_power_of_two(d) for d in dims]
        if n.duration_micros >= 100:
            assert abs(times[n.id].duration_micros / n.duration_micros - 1) <= 0.05 + 0.01
    assert any(times[n.id].duration_micros != n.duration_micros for n in before)
    for command, extra in (("stats", ()), ("whatif", ("--comm", "0.25x"))):  # shapes: equal
        assert _numbers(_run_json(command, tmp_path / "shapes", *extra)) == \
            _numbers(_run_json(command, out, *extra)), command
    recorded = _run_json("whatif", out, "--comm", "0.25x")["predicted_us"]
    perturbed = _run_json("whatif", tmp_path / "times", "--comm", "0.25x")["predicted_us"]
    assert abs(perturbed / recorded - 1) <= 0.05


def test_our_recording_shares_without_a_leak(tmp_path, key):
    """The README's main job: MoE module names, gloo threads and process-group descriptions
    among the strings."""
    recorded = subprocess.run([sys.executable, str(REPO / "examples" / "train_tiny_moe.py"),
                               str(tmp_path / "run")], capture_output=True, text=True,
                              timeout=600)
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    _ok(_cli("convert", tmp_path / "run", "-o", tmp_path / "out"))
    said = _ok(_cli("share", tmp_path / "out", "-o", tmp_path / "shared", "--key-file", key))
    assert "moe_module" in said
    _ok(_cli("share", "--check", tmp_path / "shared", tmp_path / "run"))
    assert _numbers(_run_json("stats", tmp_path / "shared")) == \
        _numbers(_run_json("stats", tmp_path / "out"))


@pytest.mark.parametrize("name", ["dlrm", "resnet", "sampled", "tpu", "b200"])
def test_astra_sim_finishes_the_shared_run_as_the_original(corpus, tmp_path, key, name):
    if not os.environ.get("ASTRA_BIN"):
        pytest.skip("set ASTRA_BIN to ASTRA-sim's analytical binary (../shared/tools/astra-build)")
    import re

    finish = {}
    out = tmp_path / "out"
    _ok(_cli("convert", *[corpus / i for i in RUNS[name]], "-o", out, "--target", "astra-sim"))
    _ok(_cli("share", out, "-o", tmp_path / "shared", "--key-file", key))
    npus = len(list(out.glob("chakra.*.et")))
    for folder in (out, tmp_path / "shared"):
        env = dict(os.environ, NETWORK_CONFIG=str(folder / "astra_network.yml"),
                   SYSTEM_CONFIG=str(folder / "astra_system.json"))
        if (folder / "comm_group.json").exists():
            env["COMM_GROUP_CONFIG"] = str(folder / "comm_group.json")
        sim = subprocess.run([str(REPO.parent / "shared" / "tools" / "astra-run"),
                              str(folder / "chakra"), str(npus)], capture_output=True, text=True,
                             env=env, timeout=1800)
        found = re.search(rf"RESULT: OK npus={npus} max_finish_cycles=(\d+)", sim.stdout)
        assert found, sim.stdout[-2000:]
        finish[folder.name] = int(found[1])
    assert finish["out"] == finish["shared"]


def test_refusals_are_one_line(tmp_path, key):
    (tmp_path / "empty").mkdir()
    for args, says in (((tmp_path / "empty", "-o", tmp_path / "s"), "a conversion's output"),
                       ((tmp_path / "empty",), "one converted run"),
                       (("--check", tmp_path / "empty"), "the original traces")):
        done = _cli("share", *args, "--key-file", key)
        assert done.returncode == 1 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    shutil.rmtree(tmp_path / "empty")


def test_a_key_is_made_only_where_asked_and_bounds_only_where_they_apply(corpus, tmp_path, key):
    """A typo in --key-file is refused, not a new key (two shared runs would no longer
    compare); --new-key makes one, and not over an existing one; --bound without --level times
    and --level times without a bound are refused; the key used is named."""
    out = tmp_path / "out"
    _ok(_cli("convert", corpus / "pytorch" / "a100_simple_add", "-o", out))
    typo = tmp_path / "nowhere" / "share.kye"
    done = _cli("share", out, "-o", tmp_path / "s1", "--key-file", typo)
    assert done.returncode == 1 and "--new-key" in done.stderr and not typo.parent.exists()
    done = _cli("share", out, "-o", tmp_path / "s2", "--key-file", key, "--new-key")
    assert done.returncode == 1 and "holds one already" in done.stderr
    said = _cli("share", out, "-o", tmp_path / "s3", "--key-file", key)
    assert said.returncode == 0 and f"using the key {key}" in said.stderr
    for extra, says in ((("--bound", "0.05"), "--level times only"),
                        (("--level", "times"), "a fraction above 0")):
        done = _cli("share", out, "-o", tmp_path / "s4", "--key-file", key, *extra)
        assert done.returncode == 1 and says in done.stderr and "\n" not in done.stderr.strip()
