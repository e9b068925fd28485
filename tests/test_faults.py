"""Faults end in one line: a folder where an output file goes, values nested thousands of
levels deep, a folder of many empty files (one warning with a count, not one per file), a
full disk (a file system's error named, not a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chakra_hooks.cli import _os_error


def _cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chakra_hooks", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def _one_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("chakra-hooks: error")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_a_folder_where_an_et_goes(dlrm_two_ranks, tmp_path):
    out = tmp_path / "out"
    (out / "chakra.0.et").mkdir(parents=True)  # was IsADirectoryError, 27 lines
    line = _one_error(_cli("convert", dlrm_two_ranks, "-o", out, "--overwrite"))
    assert f"{out / 'chakra.0.et'}: a folder where a file goes" in line
    assert sorted(p.name for p in out.iterdir()) == ["chakra.0.et"]  # nothing else left


def test_values_nested_thousands_deep(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
               "ts": 1000 + i, "dur": 5, "args": {"External id": i + 1}} for i in range(5)]
    text = json.dumps({"schemaVersion": 1, "traceEvents": events})
    deep = '{"a":' * 3000 + "1" + "}" * 3000  # was RecursionError, 44 lines
    text = text.replace('"External id": 3}', '"External id": 3, "deep": ' + deep + "}")
    trace = tmp_path / "deep.json"
    trace.write_text(text)
    line = _one_error(_cli("convert", trace, "-o", tmp_path / "out"))
    assert f"{trace}: a value nested too deeply" in line
    assert not (tmp_path / "out").exists()


def test_many_skipped_files_are_one_warning(corpus, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("kineto.json.gz",):
        (run / name).write_bytes((corpus / "pytorch" / "rtx2080_linear" / name).read_bytes())
    for i in range(40):
        (run / f"empty{i}.json").write_text("")
    done = _cli("convert", run, "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    skipped = [line for line in done.stderr.splitlines() if "skipped" in line]
    assert skipped == [line for line in skipped if "40 files skipped" in line] and len(skipped) == 1


@pytest.mark.parametrize("errno_name, says", [("ENOSPC", "no space left on the device"),
                                              ("EISDIR", "a folder where a file goes")])
def test_file_system_errors_read_as_one_line(errno_name, says):
    import errno

    code = getattr(errno, errno_name)
    line = _os_error(OSError(code, "x", "/out/chakra.0.et"))
    assert line.startswith("/out/chakra.0.et: ") and says in line
    moved = _os_error(OSError(code, "x", "/out/.staging/chakra.0.et", None, "/out/chakra.0.et"))
    assert moved.startswith("/out/chakra.0.et: ")


def test_events_whose_time_cannot_belong_to_the_trace_are_dropped_and_said(corpus, tmp_path):
    """A kernel at ts 0 (53 years before the rest) made a host_gap of 1.7e15 us; a cpu_op of
    1e12 us swallowed the later ops of its thread. Both kept silently, exit 0."""
    import gzip

    from chakra_hooks.converter import etio
    from chakra_hooks.converter.stats import rank_stats

    doc = json.loads(gzip.decompress((corpus / "pytorch" / "rtx2080_linear" /
                                      "kineto.json.gz").read_bytes()))
    events = doc["traceEvents"]
    [e for e in events if e.get("cat") == "kernel"][5]["ts"] = 0
    [e for e in events if e.get("cat") == "cpu_op"][10]["dur"] = 1e12
    trace = tmp_path / "kineto.json"
    trace.write_text(json.dumps(doc))
    done = _cli("convert", trace, "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "2 events dropped whose time cannot belong to the trace" in done.stderr
    et = etio.read_et(tmp_path / "out" / "chakra.0.et")
    meta = {a.name: a for a in et.metadata.attr}
    assert meta["kineto_out_of_range"].int64_val == 2
    assert rank_stats("x", et.nodes).span_us < 10e6  # seconds, as recorded; not decades


def test_ops_and_kernels_that_are_not_complete_events_are_said(corpus, tmp_path):
    """Kernels without ph (6,080 kernels and all 75 collectives of a run) and an op whose ph
    became "B" were gone without a word: only complete events ("X") are read."""
    import gzip

    doc = json.loads(gzip.decompress((corpus / "pytorch" / "rtx2080_linear" /
                                      "kineto.json.gz").read_bytes()))
    events = doc["traceEvents"]
    for e in [e for e in events if e.get("cat") == "kernel"][:100]:
        del e["ph"]
    [e for e in events if e.get("cat") == "cpu_op"][3]["ph"] = "B"
    trace = tmp_path / "kineto.json"
    trace.write_text(json.dumps(doc))
    done = _cli("convert", trace, "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert ("101 events of op / kernel categories are not complete events (ph 'X') and were "
            "not read: 100 kernel without ph, 1 cpu_op with ph 'B'") in done.stderr


@pytest.mark.parametrize("with_et", [False, True])
def test_collectives_whose_kernels_are_missing_stay_collectives(corpus, tmp_path, with_et):
    """A profile without the NCCL kernels, the host's c10d calls still there: the ET had no
    COMM node and 0 comm bytes, without a word."""
    import gzip
    import shutil

    from chakra_hooks.converter import etio

    run = corpus / "pytorch" / "v100_dlrm_8rank"
    name = "worker0_step_12.1694128201545.pt.trace.json"
    doc = json.loads(gzip.decompress((run / f"{name}.gz").read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    nccl = [e for e in kernels if "nccl" in e["name"].lower()]
    assert len(nccl) == 8 and len(kernels) > 100
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e not in nccl]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_text(json.dumps(doc))
    if with_et:
        shutil.copy(run / "dlrm_eg_0.json.gz", tmp_path / "in")
    done = _cli("convert", tmp_path / "in", "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert ("8 collectives recorded on the host have no device kernel (the device trace holds "
            "no communication kernels): kept as COMM nodes timed by their host calls"
            in done.stderr)
    et = etio.read_et(tmp_path / "out" / "chakra.0.et")
    comm = [n for n in et.nodes if n.type == 7]
    assert len(comm) == 8
    assert all(any(a.name == "comm_host_timed" for a in n.attr) for n in comm)
    assert {a.name: a.int64_val for a in et.metadata.attr}["comm_host_timed"] == 8
    sizes = [a.int64_val or a.uint64_val for n in comm for a in n.attr if a.name == "comm_size"]
    # The ET's tensors give every size; Kineto alone records the all-to-alls' only (the
    # all-reduces' tensor lists have no shapes there, said by comm_size_unknown).
    assert sum(sizes) == (2549700 if with_et else 64448)


def test_device_events_that_start_before_their_launch_are_not_linked_to_it(corpus, tmp_path):
    """Correlation ids shuffled among a trace's kernels linked each to another op's launch,
    said only as a count: the ET's device work hung on the wrong host ops. No device event of
    the corpus starts before the call its id names; shuffled, a third do."""
    import gzip
    import random

    from chakra_hooks.converter import etio

    doc = json.loads(gzip.decompress((corpus / "pytorch" / "rtx2080_linear" /
                                      "kineto.json.gz").read_bytes()))
    device = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")]
    launches = {e["args"]["correlation"]: e for e in doc["traceEvents"]
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    one = device[10]
    one["ts"] = launches[one["args"]["correlation"]]["ts"] - 5  # one kernel 5 us too early
    (tmp_path / "one.json").write_text(json.dumps(doc))
    ids = [e["args"]["correlation"] for e in device]
    random.Random(7).shuffle(ids)
    for e, i in zip(device, ids):
        e["args"]["correlation"] = i
    (tmp_path / "shuffled").mkdir()
    (tmp_path / "shuffled" / "kineto.json").write_text(json.dumps(doc))

    import re

    done = _cli("convert", tmp_path / "one.json", "-o", tmp_path / "out1")
    assert done.returncode == 0, done.stderr
    found = re.search(r"(\d+) of (\d+) device events start before the runtime call their "
                      r"correlation id names \(no kernel runs before its launch\): those are "
                      r"not linked to it", done.stderr)
    assert found and found[1] == "1", done.stderr
    linked = int(found[2])
    done = _cli("convert", tmp_path / "shuffled", "-o", tmp_path / "out2")
    assert done.returncode == 0, done.stderr
    assert (f"the trace's correlation ids are damaged; none of the {linked} is linked to a "
            "launch") in done.stderr
    et = etio.read_et(tmp_path / "out2" / "chakra.0.et")
    assert {a.name: a.int64_val for a in et.metadata.attr}["kineto_launch_unlinked"] == linked

    def lane(node) -> str:
        return next(a.string_val for a in node.attr if a.name == "lane")

    host = {n.id for n in et.nodes if lane(n).startswith("thread:")}
    device_nodes = [n for n in et.nodes if lane(n).startswith("stream:")]
    assert len(device_nodes) > 1000 and not any(set(n.ctrl_deps) & host for n in device_nodes)


@pytest.mark.parametrize("damage", ["repeat", "strings"])
def test_xspace_repeats_and_numbers_as_strings_are_said(corpus, tmp_path, damage):
    """An XSpace with a device event recorded twice made two nodes; with its integer stats
    as strings, device times became 0 and host launches went missing (82 of 189 nodes): each
    without a word. Now: the repeat dropped, strings that spell integers read as them, and
    both said and counted."""
    from chakra_hooks.converter import etio
    from chakra_hooks.linker.xla import xspace_pb2

    name = "mi300x_jax_conv.xplane.pb"
    space = xspace_pb2.XSpace.FromString((corpus / "jax_xla" / name).read_bytes())
    if damage == "repeat":
        plane = next(p for p in space.planes if p.name == "/device:GPU:1")
        line = max(plane.lines, key=lambda line: len(line.events))
        line.events.add().CopyFrom(line.events[3])
    else:
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    for stat in event.stats:
                        kind = stat.WhichOneof("value")
                        if kind in ("int64_value", "uint64_value"):
                            stat.str_value = str(getattr(stat, kind))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_bytes(space.SerializeToString())
    original = _cli("convert", corpus / "jax_xla" / name, "-o", tmp_path / "original")
    done = _cli("convert", tmp_path / "in", "-o", tmp_path / "out")
    assert original.returncode == 0 and done.returncode == 0, done.stderr
    key = {"repeat": "xspace_repeats_dropped", "strings": "xspace_stats_as_strings"}[damage]
    said = {"repeat": "1 device events are exact repeats of another",
            "strings": "stat records that hold integers are strings (correlation_id x"}[damage]
    assert said in done.stderr
    counted = 0
    for et_path in sorted((tmp_path / "original").glob("chakra.*.et")):
        before, after = etio.read_et(et_path), etio.read_et(tmp_path / "out" / et_path.name)
        assert [(n.name, n.duration_micros) for n in after.nodes] == \
            [(n.name, n.duration_micros) for n in before.nodes]
        counted += {a.name: a.int64_val for a in after.metadata.attr}.get(key, 0)
    assert counted > 0


def test_two_runs_pair_only_when_nearly_every_op_matches(corpus, tmp_path):
    """A ResNet ET of one GPU with another GPU's ResNet profile matched 62.9 % of its ops and
    converted, exit 0, 119 ops without a duration. Two runs (their pids differ) now pair only
    at 95 %; the corpus's pair of two runs of one program still does (100 %)."""
    import gzip
    import shutil

    run = corpus / "pytorch" / "a100_resnet_nccl"
    done = _cli("convert", run, "-o", tmp_path / "same")
    assert done.returncode == 0, done.stderr
    doc = json.loads(gzip.decompress((run / "kineto.json.gz").read_bytes()))
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    gone = {id(e) for e in ops[::3]}  # a third of the host ops: another run's profile
    doc["traceEvents"] = [e for e in doc["traceEvents"] if id(e) not in gone]
    (tmp_path / "other").mkdir()
    shutil.copy(run / "host_et.json.gz", tmp_path / "other")
    (tmp_path / "other" / "kineto.json").write_text(json.dumps(doc))
    line = _one_error(_cli("convert", tmp_path / "other", "-o", tmp_path / "out"))
    assert "match the Kineto trace; the pids differ" in line and "at least 95%" in line, line
    assert "--force-pair" in line and not (tmp_path / "out").exists()
    forced = _cli("convert", tmp_path / "other", "-o", tmp_path / "out", "--force-pair")
    assert forced.returncode == 0 and "linked as one (--force-pair)" in forced.stderr


def test_a_relabelled_rank_is_said_and_one_beyond_the_world_refused(corpus, tmp_path):
    """A DLRM rank's trace relabelled as rank 9 of 8 converted as a ninth rank."""
    import gzip
    import shutil

    run = corpus / "pytorch" / "v100_dlrm_8rank"
    (tmp_path / "in").mkdir()
    for trace in run.glob("worker*.json.gz"):
        shutil.copy(trace, tmp_path / "in")
    first = sorted((tmp_path / "in").glob("worker0_*"))[0]
    doc = json.loads(gzip.decompress(first.read_bytes()))
    for rank, says in ((9, None), (1, "its name says rank 0, its distributedInfo rank 1")):
        doc["distributedInfo"]["rank"] = rank
        first.write_bytes(gzip.compress(json.dumps(doc).encode()))
        done = _cli("convert", tmp_path / "in", "-o", tmp_path / "out")
        if says is None:
            assert "distributedInfo.rank: a rank below the trace's world_size 8, got 9" in \
                _one_error(done)
        else:
            assert says in done.stderr and done.returncode == 1  # two traces of rank 1
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["moved", "long"])
def test_xspace_events_whose_time_cannot_belong_are_dropped_and_said(corpus, tmp_path, damage):
    """An XSpace device event moved 11.6 days made a span of 11.6 days; one lasting that
    long swallowed the 11 ops after it. Both silently, exit 0."""
    from chakra_hooks.converter import etio
    from chakra_hooks.converter.stats import rank_stats
    from chakra_hooks.linker.xla import xspace_pb2

    name = "mi300x_jax_conv.xplane.pb"
    space = xspace_pb2.XSpace.FromString((corpus / "jax_xla" / name).read_bytes())
    plane = next(p for p in space.planes if p.name == "/device:GPU:1")
    event = max(plane.lines, key=lambda line: len(line.events)).events[3]
    if damage == "moved":
        event.offset_ps += 10**18
    else:
        event.duration_ps = 10**18
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_bytes(space.SerializeToString())
    done = _cli("convert", tmp_path / "in", "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "1 device events dropped whose time cannot belong to the profile" in done.stderr
    et = etio.read_et(tmp_path / "out" / "chakra.1.et")
    assert {a.name: a.int64_val for a in et.metadata.attr}["xspace_out_of_range"] == 1
    assert rank_stats("x", et.nodes).span_us < 1e6  # a fraction of a second, as recorded
