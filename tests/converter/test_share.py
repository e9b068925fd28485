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


def _int_lists(text: str) -> list[tuple[int, ...]]:
    """The innermost lists of whole numbers in an ET's JSON text (a shape, a size or stride
    argument; a tensor's [id, storage, offset, numel, itemsize, device] holds a string)."""
    found, stack = [], [json.loads(text)] if text else []
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                found.append(tuple(value))
            else:
                stack.extend(value)
    return found


def _exact_shapes_left(original: Path, shared: Path, read) -> tuple[int, int]:
    """(shapes of the original with a dimension that is not a power of two, how many of them
    the same node of the shared run still holds among its shapes or values), read with the
    reference reader."""
    exact = kept = 0
    for path in sorted(original.glob("chakra.*.et")):
        shared_nodes = {n.id: n for n in read(shared / path.name)[1]}
        for node in read(path)[1]:
            mine = {shape for io in (node.inputs, node.outputs) for text in (io.shapes, io.values)
                    for shape in _int_lists(text)
                    if any(d > 1 and d & (d - 1) for d in shape)}
            theirs = shared_nodes[node.id]
            left = {shape for io in (theirs.inputs, theirs.outputs)
                    for text in (io.shapes, io.values) for shape in _int_lists(text)}
            exact += len(mine)
            kept += len(mine & left)
    return exact, kept


def _times(node) -> tuple[int | None, int, int]:
    """(start, duration, ps per unit) at a node's finest unit, read as the run tools read it."""
    attrs = {a.name: a for a in node.attr}
    for unit, scale in (("ns", 1000), ("ps", 1)):
        if f"start_{unit}" in attrs:
            dur = attrs.get(f"duration_{unit}")
            return (attrs[f"start_{unit}"].int64_val * scale,
                    (dur.int64_val if dur is not None else 0) * scale, scale)
    if "duration_unknown" in attrs:
        return node.start_time_micros * 10**6 or None, 0, 10**6
    return node.start_time_micros * 10**6 or None, node.duration_micros * 10**6, 10**6


def _durations_read_back(original: Path, shared: Path, read) -> tuple[int, int]:
    """(recorded durations above 0, how many the shared run gives back exactly: as the node's
    own duration, or as the next start on its lane or a dependent's start minus its own),
    read with the reference reader."""
    total = back = 0
    for path in sorted(original.glob("chakra.*.et")):
        recorded = {n.id: _times(n)[1] for n in read(path)[1]}
        nodes = read(shared / path.name)[1]
        times = {n.id: _times(n) for n in nodes}
        users: dict[int, list[int]] = {}
        lanes: dict[str, list[int]] = {}
        for n in nodes:
            for d in (*n.data_deps, *n.ctrl_deps):
                users.setdefault(d, []).append(n.id)
            lane = next((a.string_val for a in n.attr if a.name == "lane"), None)
            if lane is not None and times[n.id][0] is not None:
                lanes.setdefault(lane, []).append(n.id)
        following = {}
        for members in lanes.values():
            members.sort(key=lambda i: (times[i][0], i))
            following.update(zip(members, members[1:]))
        for nid, dur in recorded.items():
            if dur <= 0:
                continue
            total += 1
            start = times[nid][0]
            later = [following[nid]] if nid in following else []
            later += users.get(nid, [])
            if times[nid][1] == dur or start is not None and any(
                    times[m][0] is not None and times[m][0] - start == dur for m in later):
                back += 1
    return total, back


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    from chakra_hooks.converter.share import load_key

    path = tmp_path_factory.mktemp("key") / "share.key"
    load_key(path, lambda _: None, new=True)
    return path


def _keeps_its_word(out: Path, tmp_path: Path, key: Path, read, originals: dict,
                    inputs=()) -> None:
    """At --level shapes, no shape of the conversion ``out`` with a dimension other than a
    power of two is left anywhere in a node (shapes or values); at --level times --bound
    0.05, at most 1 % of the recorded durations can be read back (the reference reader's
    count, which share --check agrees with), and stats and whatif stay within the bound of
    ``originals`` (their JSON runs)."""
    from chakra_hooks.converter.share import Options, share_run

    secret = key.read_text().strip().encode()
    share_run(out, tmp_path / "shapes", secret, Options("shapes"))
    exact, kept = _exact_shapes_left(out, tmp_path / "shapes", read)
    assert kept == 0, f"{kept} of {exact} exact shapes left"
    share_run(out, tmp_path / "times", secret, Options("times", 0.05))
    total, back = _durations_read_back(out, tmp_path / "times", read)
    assert back <= 0.01 * total, f"{back} of {total} durations read back"
    said = _ok(_cli("share", "--check", tmp_path / "times", out, *inputs))
    assert f"{back:,} of {total:,} recorded durations can be read back" in said, said
    for command, extra in (("stats", ()), ("whatif", ("--comm", "0.25x"))):
        now = _run_json(command, tmp_path / "times", *extra)
        for figure in ("span_us", "critical_path_us", "replayed_us", "predicted_us"):
            if figure in now:
                was = originals[command][figure]
                assert abs(now[figure] - was) <= 0.05 * was, (command, figure, was, now[figure])


@pytest.mark.parametrize("name", sorted(RUNS))
def test_corpus_runs_share_without_a_leak(corpus, tmp_path, key, name, reference_reader):
    inputs = [corpus / i for i in RUNS[name]]
    out, shared = tmp_path / "out", tmp_path / "shared"
    _ok(_cli("convert", *inputs, "-o", out))
    _ok(_cli("share", out, "-o", shared, "--key-file", key))
    said = _ok(_cli("share", "--check", shared, *inputs))
    assert "none of" in said
    _ok(_cli("validate", shared))
    originals = {}
    for command, extra in (("stats", ()), ("whatif", ("--comm", "0.25x"))):
        originals[command] = _run_json(command, out, *extra)
        assert _numbers(_run_json(command, shared, *extra)) == _numbers(originals[command]), \
            command
    _keeps_its_word(out, tmp_path, key, reference_reader, originals, inputs)
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
        wait = {a.name: a.int64_val for a in n.attr}.get("peer_wait_ns", 0) // 1000
        if n.duration_micros - wait >= 100:  # a collective's wait follows its peers' arrivals
            now = times[n.id].duration_micros - {a.name: a.int64_val for a in times[n.id].attr
                                                 }.get("peer_wait_ns", 0) // 1000
            assert abs(now / (n.duration_micros - wait) - 1) <= 0.05 + 0.01
    assert any(times[n.id].duration_micros != n.duration_micros for n in before)
    for command, extra in (("stats", ()), ("whatif", ("--comm", "0.25x"))):  # shapes: equal
        assert _numbers(_run_json(command, tmp_path / "shapes", *extra)) == \
            _numbers(_run_json(command, out, *extra)), command
    recorded = _run_json("whatif", out, "--comm", "0.25x")["predicted_us"]
    perturbed = _run_json("whatif", tmp_path / "times", "--comm", "0.25x")["predicted_us"]
    assert abs(perturbed / recorded - 1) <= 0.05


def test_our_recording_shares_without_a_leak(tmp_path, key, reference_reader):
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
    originals = {"stats": _run_json("stats", tmp_path / "out"),
                 "whatif": _run_json("whatif", tmp_path / "out", "--comm", "0.25x")}
    assert _numbers(_run_json("stats", tmp_path / "shared")) == _numbers(originals["stats"])
    _keeps_its_word(tmp_path / "out", tmp_path, key, reference_reader, originals,
                    [tmp_path / "run"])


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
