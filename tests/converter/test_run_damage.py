"""A damaged conversion read by the run tools (`stats`, `whatif`, `timeline`): each damage is
refused in one line naming the file, the record and what was expected, or named in a warning
by every command; never figures made silently of a broken run. The run: the corpus DLRM
conversion (8 ranks, NCCL)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from chakra_hooks.converter import etio
from chakra_hooks.convert import convert_paths

COMMANDS = (["stats"], ["whatif", "--comm", "0.5x"], ["timeline", "-o", "{out}"])


def _copy(dlrm_converted: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(dlrm_converted, run)
    return run


def _edit(path: Path, change) -> None:
    """Rewrite one ET with ``change(nodes)`` applied to its decoded nodes."""
    et = etio.read_et(path)
    nodes = list(et.nodes)
    change(nodes)
    etio.write_et(path, et.metadata, nodes)


def _each(run: Path, tmp_path: Path) -> list[subprocess.CompletedProcess]:
    out = []
    for command in COMMANDS:
        args = [part.replace("{out}", str(tmp_path / "t.json")) for part in command]
        out.append(subprocess.run([sys.executable, "-m", "chakra_hooks", *args, str(run)],
                                  capture_output=True, text=True, timeout=300))
    return out


def _refused(run: Path, tmp_path: Path, *words: str) -> None:
    for done in _each(run, tmp_path):
        assert done.returncode == 1 and not done.stdout, (done.args, done.stdout[-300:])
        line = done.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, line
        assert all(word in line for word in words), line


def _warned(run: Path, tmp_path: Path, *words: str) -> None:
    for done in _each(run, tmp_path):
        assert done.returncode == 0, done.stderr[-500:]
        warnings = [line for line in done.stderr.splitlines() if "warning:" in line]
        assert any(all(word in line for word in words) for line in warnings), done.stderr


def test_a_negative_duration_is_refused(dlrm_converted, tmp_path):
    run = _copy(dlrm_converted, tmp_path)

    def negative(nodes):
        for node in nodes[100:110]:
            for attr in node.attr:
                if attr.name == "duration_ns":
                    attr.uint64_val = 0
                    attr.int64_val = -5000
            node.duration_micros = 0
    _edit(run / "chakra.3.et", negative)
    _refused(run, tmp_path, "chakra.3.et", "node", "a duration of 0 or more")


def test_a_duplicate_node_id_is_refused(dlrm_converted, tmp_path):
    run = _copy(dlrm_converted, tmp_path)

    def duplicate(nodes):
        nodes[200].id = nodes[100].id
    _edit(run / "chakra.2.et", duplicate)
    _refused(run, tmp_path, "chakra.2.et", "a node id used once")


def test_a_dependency_cycle_is_named_by_every_command(dlrm_converted, tmp_path):
    run = _copy(dlrm_converted, tmp_path)

    def cycle(nodes):
        a, b = nodes[300], nodes[301]
        a.ctrl_deps.append(b.id)
        b.ctrl_deps.append(a.id)
    _edit(run / "chakra.3.et", cycle)
    _warned(run, tmp_path, "chakra.3.et", "dependency cycle")
    stats = subprocess.run([sys.executable, "-m", "chakra_hooks", "stats", "--json", str(run)],
                           capture_output=True, text=True, timeout=300)
    summary = orjson.loads(stats.stdout.splitlines()[-1])["run"]
    assert any("dependency cycle" in w for w in summary["warnings"])


def test_an_et_copied_over_another_rank_or_beside_is_refused(dlrm_converted, tmp_path):
    run = _copy(dlrm_converted, tmp_path)
    shutil.copy(run / "chakra.2.et", run / "chakra.3.et")
    _refused(run, tmp_path, "chakra.3.et", "rank 3", "metadata says rank 2")
    run = _copy(dlrm_converted, tmp_path / "beside")
    shutil.copy(run / "chakra.2.et", run / "chakra.8.et")
    _refused(run, tmp_path, "chakra.8.et", "metadata says rank 2")


def test_two_runs_given_as_one_are_refused(dlrm_converted, corpus, tmp_path):
    other = tmp_path / "other"
    convert_paths([corpus / "pytorch" / "a100_resnet_nccl"], other, progress=False,
                  warn=lambda _: None)
    both = [subprocess.run([sys.executable, "-m", "chakra_hooks", "stats",
                            str(dlrm_converted / "chakra.0.et"), str(other / "chakra.0.et")],
                           capture_output=True, text=True, timeout=300)]
    line = both[0].stderr.strip()
    assert both[0].returncode == 1 and "\n" not in line, line
    assert "world_size" in line or "one ET per rank" in line, line


@pytest.mark.parametrize("groups, words", [
    ({"0": [0, 1, 2, 3, 4, 5, 6, 7], "1": ["a", 1]}, ("comm_group.json", "group '1'",
                                                       "distinct whole numbers")),
    ({"0": [0, 1, 2, 3, 4, 5, 6, 9]}, ("comm_group.json", "below the run's world_size 8")),
])
def test_a_comm_group_file_that_is_wrong_is_refused(dlrm_converted, tmp_path, groups, words):
    run = _copy(dlrm_converted, tmp_path)
    (run / "comm_group.json").write_bytes(orjson.dumps(groups))
    _refused(run, tmp_path, *words)


def _group_of_node(run: Path, rank: int, group: str) -> None:
    """Rank ``rank``'s first collective made one of process group ``group``."""
    def regroup(nodes):
        node = next(n for n in nodes if n.type == 7)
        for attr in node.attr:
            if attr.name == "pg_name":
                attr.string_val = group
    _edit(run / f"chakra.{rank}.et", regroup)


def test_a_collective_of_a_group_its_rank_is_not_in_is_refused(dlrm_converted, tmp_path):
    run = _copy(dlrm_converted, tmp_path)
    _group_of_node(run, 3, "1")
    (run / "comm_group.json").write_bytes(orjson.dumps({"1": [0, 1]}))
    _refused(run, tmp_path, "comm_group.json", "group '1'", "rank 3 among its members",
             "chakra.3.et")


def test_a_group_comm_group_json_does_not_list_is_named(dlrm_converted, tmp_path):
    run = _copy(dlrm_converted, tmp_path)
    _group_of_node(run, 3, "5")
    (run / "comm_group.json").write_bytes(orjson.dumps({"1": [0, 1]}))
    _warned(run, tmp_path, "comm_group.json", "'5'", "waits for peers are unknown")


def test_validate_names_what_the_run_tools_refuse(dlrm_converted, tmp_path):
    """A negative duration is a problem of its file, an ET copied over another rank's one of
    the run; comm_group.json given as an ET is sent to its folder."""
    run = _copy(dlrm_converted, tmp_path)

    def negative(nodes):
        for attr in nodes[100].attr:
            if attr.name == "duration_ns":
                attr.uint64_val = 0
                attr.int64_val = -5000
    _edit(run / "chakra.3.et", negative)
    shutil.copy(run / "chakra.2.et", run / "chakra.5.et")
    done = subprocess.run([sys.executable, "-m", "chakra_hooks", "validate", str(run)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "duration: node" in done.stdout and "a duration below 0" in done.stdout, done.stdout
    assert "as one run of 8 file(s): FAILED" in done.stdout and "chakra.5.et" in done.stdout
    (run / "comm_group.json").write_bytes(b"{}")
    done = subprocess.run([sys.executable, "-m", "chakra_hooks", "stats",
                           str(run / "comm_group.json")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "give the folder" in done.stderr, done.stderr
