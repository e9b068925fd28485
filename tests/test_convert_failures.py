"""`convert` on bad input: one line naming the file, exit 1, nothing in the output folder, also
when the bad rank is converted in a worker process."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from chakra_hooks.common.errors import TraceFormatError


def test_trace_format_error_survives_pickling() -> None:
    error = pickle.loads(pickle.dumps(TraceFormatError("a.json", "event 3", "a number")))
    assert str(error) == "a.json: event 3: a number" and error.where == "event 3"


def test_truncated_rank_in_a_parallel_run_leaves_nothing(dlrm_two_ranks: Path,
                                                         tmp_path: Path) -> None:
    run = dlrm_two_ranks
    kineto = next(run.glob("worker1_step_12.*.pt.trace.json.gz"))
    kineto.write_bytes(kineto.read_bytes()[:20000])  # rank 1 cut short
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "chakra_hooks", "convert", str(run), "-o", str(out), "-j", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "worker1_step_12" in errors[0] and "truncated" in errors[0]
    assert "Traceback" not in result.stderr
    assert not out.exists() or not any(out.iterdir())


def test_a_time_before_1970_is_refused_in_one_line(corpus: Path, tmp_path: Path) -> None:
    """A kernel at ts -5 us (or a negative baseTimeNanoseconds) cannot be a Kineto epoch time
    and cannot be written as a Chakra start time: one line naming the event, not a traceback
    from the node writer."""
    import gzip
    import json

    doc = json.loads(gzip.open(corpus / "pytorch" / "a100_simple_add" / "kineto.json.gz").read())
    kernel = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel")
    doc["traceEvents"][kernel]["ts"] = -5
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "kineto.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "chakra_hooks", "convert", str(tmp_path / "in"),
                             "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert f"traceEvents[{kernel}]" in line and "ts -5000 ns" in line and len(line) < 400
    assert not out.exists()


def test_a_missing_or_textual_time_is_said_in_the_users_words(corpus: Path, tmp_path: Path) -> None:
    import gzip
    import json

    from chakra_hooks.convert import convert_paths

    doc = json.loads(gzip.open(corpus / "pytorch" / "a100_simple_add" / "kineto.json.gz").read())
    kernel = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel")
    for field, value, said in (("ts", None, "ts: a number, got null"),
                               ("dur", "x", "dur: a number, got a string ('x')")):
        broken = json.loads(json.dumps(doc))
        broken["traceEvents"][kernel][field] = value
        folder = tmp_path / field
        folder.mkdir()
        (folder / "kineto.json").write_text(json.dumps(broken))
        try:
            convert_paths([folder], tmp_path / f"out_{field}", progress=False)
        except TraceFormatError as exc:
            assert str(exc) == f"{folder / 'kineto.json'}: traceEvents[{kernel}]: {said}"
        else:
            raise AssertionError(f"a {field} of {value!r} was accepted")


def test_damaged_et_parent_links_and_ids_are_refused_or_said(corpus: Path, tmp_path: Path) -> None:
    """Each used to drop ops without a word (a100_simple_add: its 19.6 s aten::rand, the span
    with it), or write one op twice. A parent the ET does not hold is kept and said (torch's
    observer writes an op when it ends, and under DDP a gloo range can end after the trace
    stopped); the others are refused."""
    import gzip
    import json

    from chakra_hooks.convert import convert_paths
    from chakra_hooks.converter.etio import read_et

    source = corpus / "pytorch" / "a100_simple_add"
    doc = json.loads(gzip.open(source / "host_et.json.gz").read())
    rand = next(n for n in doc["nodes"] if n["name"] == "aten::rand")
    other = next(n for n in doc["nodes"] if n["id"] != rand["id"] and n["name"].startswith("aten::"))

    def case(change) -> Path:
        """A run folder with the ET changed by ``change(nodes by id, document)``."""
        broken = json.loads(json.dumps(doc))
        change({n["id"]: n for n in broken["nodes"]}, broken)
        folder = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        (folder / "host_et.json").write_text(json.dumps(broken))
        (folder / "kineto.json.gz").write_bytes((source / "kineto.json.gz").read_bytes())
        return folder

    def damaged(change) -> str:
        folder = case(change)
        try:
            convert_paths([folder], folder / "out", progress=False)
        except TraceFormatError as exc:
            assert "host_et.json" in str(exc) and not (folder / "out").exists()
            return str(exc)
        raise AssertionError("accepted")

    # The op hangs from its thread's root, kept and said.
    folder = case(lambda by, d: by[rand["id"]].update(ctrl_deps=424242))
    warnings: list[str] = []
    convert_paths([folder], folder / "out", progress=False, warn=warnings.append)
    assert any("1 nodes name a parent the ET does not hold" in w for w in warnings), warnings
    assert [n for n in read_et(folder / "out" / "chakra.0.et").nodes if n.name == "aten::rand"]
    assert "other than itself" in damaged(lambda by, d: by[rand["id"]].update(ctrl_deps=rand["id"]))
    assert "loops" in damaged(lambda by, d: (by[rand["id"]].update(ctrl_deps=other["id"]),
                                             by[other["id"]].update(ctrl_deps=rand["id"])))
    assert "unique node ids" in damaged(lambda by, d: d["nodes"].append(dict(rand)))


def test_traces_of_jobs_of_different_sizes_are_refused_together(corpus: Path, tmp_path: Path) -> None:
    """One rank of a 128-rank job and one of an 8-rank job in one folder are not ranks 0 and 1
    of one run."""
    import shutil

    from chakra_hooks.convert import convert_paths

    shutil.copy(corpus / "kineto_only" / "sampled_rank-0.json.gz", tmp_path)
    shutil.copy(next((corpus / "pytorch" / "v100_dlrm_8rank").glob("worker1_*")), tmp_path)
    try:
        convert_paths([tmp_path], tmp_path / "out", progress=False)
    except TraceFormatError as exc:
        assert "(8 ranks)" in str(exc) and "(128 ranks)" in str(exc)
    else:
        raise AssertionError("accepted as one run")
    assert not (tmp_path / "out").exists()


def test_a_device_event_with_text_ids_is_refused(corpus: Path, tmp_path: Path) -> None:
    import gzip
    import json

    from chakra_hooks.convert import convert_paths

    doc = json.loads(gzip.open(corpus / "pytorch" / "a100_simple_add" / "kineto.json.gz").read())
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[-1]["args"]["correlation"] = "y"  # not the first of its stream: checked per op
    (tmp_path / "kineto.json").write_text(json.dumps(doc))
    try:
        convert_paths([tmp_path / "kineto.json"], tmp_path / "out", progress=False)
    except TraceFormatError as exc:
        assert "args.correlation: an integer of 64 bits, got a string ('y')" in str(exc)
    else:
        raise AssertionError("accepted")


def test_a_base_time_that_is_no_integer_is_refused(corpus: Path, tmp_path: Path) -> None:
    """It used to be ignored, leaving every time 55 years early without a word."""
    import gzip
    import json

    from chakra_hooks.convert import convert_paths

    doc = json.loads(gzip.open(corpus / "kineto_only" / "b200_eager_rank0.json.gz").read())
    doc["baseTimeNanoseconds"] = "soon"
    (tmp_path / "k.json").write_text(json.dumps(doc))
    try:
        convert_paths([tmp_path / "k.json"], tmp_path / "out", progress=False)
    except TraceFormatError as exc:
        assert str(exc).endswith("baseTimeNanoseconds: an integer (ns since the epoch), got a "
                                 "string ('soon')")
    else:
        raise AssertionError("accepted")


def test_a_base_time_in_the_future_is_said(corpus: Path, tmp_path: Path) -> None:
    """baseTimeNanoseconds 2e18 (year 2033) moves every time 30 years later: plausible enough
    to convert, so the conversion says it and the ET's metadata keeps it (inspect shows it)."""
    import gzip
    import json

    from chakra_hooks.convert import convert_paths
    from chakra_hooks.converter.etio import read_et

    doc = json.loads(gzip.open(corpus / "kineto_only" / "b200_eager_rank0.json.gz").read())
    doc["baseTimeNanoseconds"] = 2 * 10**18
    (tmp_path / "k.json").write_text(json.dumps(doc))
    said: list[str] = []
    convert_paths([tmp_path / "k.json"], tmp_path / "out", progress=False, warn=said.append)
    (line,) = [w for w in said if "after today" in w]
    assert "k.json" in line and "events start on 2033-" in line
    meta = read_et(tmp_path / "out" / "chakra.0.et").metadata
    assert "starts 2033-" in str(meta)


def _damaged_simple_add(corpus: Path, folder: Path, where: str) -> None:
    """a100_simple_add with one number of 10^30 (found by the fuzz tests: a traceback from the
    node writer, 'out of range for int64_val')."""
    import gzip
    import json

    source = corpus / "pytorch" / "a100_simple_add"
    kineto = json.loads(gzip.open(source / "kineto.json.gz").read())
    et = json.loads(gzip.open(source / "host_et.json.gz").read())
    kernel = next(e for e in kineto["traceEvents"] if e.get("cat") == "kernel")
    if where == "et id":
        et["nodes"][11]["id"] = 10**30
    elif where == "device":
        kernel["args"]["device"] = []  # found by the long fuzz run: an unhashable lane key
    elif where == "stream":
        kernel["args"]["stream"] = -3  # converted as a stream of its own, without a word
    else:
        kernel["args"]["correlation"] = 10**30
    folder.mkdir()
    (folder / "kineto.json").write_text(json.dumps(kineto))
    (folder / "host_et.json").write_text(json.dumps(et))


def test_numbers_beyond_64_bits_are_refused(corpus: Path, tmp_path: Path) -> None:
    from chakra_hooks.convert import convert_paths

    for where, expected in (("et id", "id: an integer from 0 to 2^63"),
                            ("correlation", "args.correlation: an integer of 64 bits"),
                            ("device", "args.device: a device number (0 to 2**32 - 1), got an "
                                       "array"),
                            ("stream", "args.stream: a stream number (0 to 2**32 - 1), got -3")):
        folder = tmp_path / where.replace(" ", "_")
        _damaged_simple_add(corpus, folder, where)
        try:
            convert_paths([folder], folder / "out", progress=False)
        except TraceFormatError as exc:
            assert expected in str(exc) and "\n" not in str(exc)
        else:
            raise AssertionError(f"{where}: accepted")
