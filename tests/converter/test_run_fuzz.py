"""Semantic fuzzing of converted runs: one damage, drawn with where it falls (a cycle, a negative
or absurd duration or start, a duplicate or dangling id, a node gone, an ET copied over or
beside another rank, metadata naming another rank or run size, ``comm_group.json`` disagreeing
with the ETs, a collective moved to another group, an unknown node or collective type), and
every run tool's answer: refused in one line naming a file of the run, or the damage named in
a warning the undamaged run does not get, or every figure the same as the undamaged run's.
Where ``validate`` reports the damage, ``stats`` and ``whatif`` may not answer as if nothing
were wrong. Runs: the corpus DLRM conversion (8 ranks, NCCL) and our 2-rank gloo recording.

``FUZZ_EXAMPLES`` examples (25 here; ``nox -s fuzz`` runs more)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from chakra_hooks.cli import cli
from chakra_hooks.converter import etio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fuzz_cases import FUZZ  # noqa: E402

COMMANDS = (("validate",), ("stats", "--json"), ("whatif", "--comm", "0.5x", "--json"))
DAY_NS = 86_400 * 10**9


def _answer(args: tuple[str, ...], run: Path) -> tuple[int, str, list[str]]:
    """(exit code, the figures (JSON, warnings left out) or the refusal, warning lines)."""
    done = CliRunner().invoke(cli, [*args, str(run)])
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception
    warnings = [line for line in done.stderr.splitlines() if "warning:" in line]
    if done.exit_code != 0:
        return done.exit_code, done.stderr.strip(), warnings
    if args[0] == "validate":
        return 0, "", warnings
    figures = orjson.loads(done.stdout.strip().splitlines()[-1])
    figures.get("run", {}).pop("warnings", None)
    return 0, orjson.dumps(figures, option=orjson.OPT_SORT_KEYS).decode(), warnings


_CLEAN: dict[str, dict[tuple[str, ...], tuple[int, str, list[str]]]] = {}


@pytest.fixture(scope="module")
def runs(dlrm_converted, gloo_traces, tmp_path_factory) -> dict[str, Path]:
    from chakra_hooks.convert import convert_paths

    ours = tmp_path_factory.mktemp("gloo_converted") / "run"
    convert_paths([gloo_traces], ours, progress=False, warn=lambda _: None)
    found = {"dlrm": dlrm_converted, "gloo": ours}
    for name, run in found.items():
        _CLEAN[name] = {args: _answer(args, run) for args in COMMANDS}
        assert all(code == 0 for code, _, _ in _CLEAN[name].values()), _CLEAN[name]
    return found


def _ets(run: Path) -> list[Path]:
    return sorted(run.glob("chakra.*.et"), key=lambda p: int(p.name.split(".")[1]))


def _edit_nodes(path: Path, change) -> None:
    et = etio.read_et(path)
    nodes = list(et.nodes)
    change(nodes, et.metadata)
    etio.write_et(path, et.metadata, nodes)


def _set(attrs, name: str, value: int) -> bool:
    for attr in attrs:
        if attr.name == name:
            kind = attr.WhichOneof("value")
            if kind in ("uint64_val", "uint32_val") and value < 0:
                attr.int64_val = value
            else:
                setattr(attr, kind, value)
            return True
    return False


def damage(run: Path, data) -> str:
    """One damage to the run in ``run`` (a copy); says what it did."""
    ets = _ets(run)
    path = data.draw(st.sampled_from(ets), label="file")
    kind = data.draw(st.sampled_from([
        "cycle", "negative", "absurd", "start_years_off", "duplicate_id", "dangling", "drop_node",
        "copy_over", "copy_beside", "meta_rank", "meta_world", "groups", "regroup",
        "node_type", "comm_type"]), label="damage")
    n = len(etio.read_et(path).nodes)
    a = data.draw(st.integers(0, n - 1), label="node")
    b = data.draw(st.integers(0, n - 1), label="other node")

    if kind == "cycle":
        def change(nodes, _):
            x, y = nodes[a], nodes[b if b != a else (a + 1) % n]
            x.ctrl_deps.append(y.id)
            y.ctrl_deps.append(x.id)
    elif kind in ("negative", "absurd"):
        value = -data.draw(st.integers(1, 10**9)) if kind == "negative" else \
            data.draw(st.integers(DAY_NS + 1, 10**18))

        def change(nodes, _):
            node = nodes[a]
            if not _set(node.attr, "duration_ns", value) and not _set(node.attr, "duration_ps",
                                                                      value * 1000):
                node.duration_micros = max(value // 1000, 0) if value > 0 else 0
                if value < 0:
                    node.attr.add(name="duration_ns", int64_val=value)
    elif kind == "start_years_off":
        years = data.draw(st.sampled_from([-30, -1, 1, 30]))

        def change(nodes, _):
            node = nodes[a]
            moved = years * 365 * DAY_NS
            for attr in node.attr:
                if attr.name == "start_ns":
                    attr.int64_val = max(attr.int64_val + moved, 1)
            if node.start_time_micros:
                node.start_time_micros = max(node.start_time_micros + moved // 1000, 1)
    elif kind == "duplicate_id":
        def change(nodes, _):
            nodes[b if b != a else (a + 1) % n].id = nodes[a].id
    elif kind == "dangling":
        def change(nodes, _):
            nodes[a].data_deps.append(max(x.id for x in nodes) + 1000)
    elif kind == "drop_node":
        def change(nodes, _):
            gone = nodes.pop(a)
            if not any(gone.id in (*x.data_deps, *x.ctrl_deps) for x in nodes):
                nodes[0].ctrl_deps.append(gone.id)  # something depended on it
    elif kind in ("copy_over", "copy_beside"):
        source = data.draw(st.sampled_from([p for p in ets if p != path] or ets), label="source")
        target = path if kind == "copy_over" else run / f"chakra.{len(ets)}.et"
        if source == target:
            target = run / f"chakra.{len(ets)}.et"
        shutil.copy(source, target)
        return f"{kind}: {source.name} -> {target.name}"
    elif kind in ("meta_rank", "meta_world"):
        value = data.draw(st.integers(0, 2 * len(ets) + 2), label="value")
        name = "rank" if kind == "meta_rank" else "world_size"
        rank = int(path.name.split(".")[1])
        if name == "rank" and value == rank:
            value += 1
        if name == "world_size" and value >= len(ets) and value == len(ets):
            value = max(len(ets) - 1, 1)

        def change(_, metadata):
            if not _set(metadata.attr, name, value):
                metadata.attr.add(name=name, int64_val=value)
    elif kind == "groups":
        groups = orjson.loads((run / "comm_group.json").read_bytes()) if \
            (run / "comm_group.json").exists() else {}
        how = data.draw(st.sampled_from(["empty", "drop_member", "beyond", "string", "drop_group",
                                         "duplicate", "not_a_list"]), label="how")
        if how == "empty" or not groups:
            groups = {}
        else:
            group = data.draw(st.sampled_from(sorted(groups)), label="group")
            members = groups[group]
            if how == "drop_member" and members:
                members.pop(data.draw(st.integers(0, len(members) - 1)))
            elif how == "beyond":
                members.append(len(ets) + data.draw(st.integers(0, 100)))
            elif how == "string":
                members.append("a")
            elif how == "drop_group":
                del groups[group]
            elif how == "duplicate" and members:
                members.append(members[0])
            else:
                groups[group] = 3
        (run / "comm_group.json").write_bytes(orjson.dumps(groups))
        return f"comm_group.json {how}"
    elif kind == "regroup":
        group = data.draw(st.sampled_from(["0", "1", "7", "99", "default", ""]), label="group")

        def change(nodes, _):
            comms = [x for x in nodes if x.type in (7, 5, 6)]
            if comms:
                _set(comms[a % len(comms)].attr, "pg_name", group) or \
                    comms[a % len(comms)].attr.add(name="pg_name", string_val=group)
    elif kind == "node_type":
        value = data.draw(st.sampled_from([0, 99, 1000]), label="type")

        def change(nodes, _):
            nodes[a].type = value
    else:  # comm_type
        value = data.draw(st.sampled_from([-1, 12, 99]), label="comm type")

        def change(nodes, _):
            comms = [x for x in nodes if x.type == 7]
            if comms:
                _set(comms[a % len(comms)].attr, "comm_type", value)
    _edit_nodes(path, change)
    return f"{kind} in {path.name} at node #{a}"


@FUZZ
@given(data=st.data())
def test_a_damaged_run_is_refused_named_or_answered_the_same(runs, tmp_path_factory, data):
    name = data.draw(st.sampled_from(sorted(runs)), label="run")
    run = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(runs[name], run)
    what = damage(run, data)
    clean = _CLEAN[name]
    validated = None
    for args in COMMANDS:
        code, said, warnings = _answer(args, run)
        new_warnings = set(warnings) - set(clean[args][2])
        if args[0] == "validate":
            validated = code
            continue
        if code != 0:
            assert code == 1 and "\n" not in said and str(run) in said, (what, args, said)
        elif not new_warnings:
            assert said == clean[args][1], f"{what}: {args[0]} answered silently otherwise"
            assert validated == 0, f"{what}: validate reports it, {args[0]} says nothing"


def test_comm_group_json_against_the_groups_the_ranks_recorded(runs, tmp_path):
    """Our recording's ETs hold the process groups torch recorded (pg_config): a
    comm_group.json listing other members for one of them is refused by every run tool."""
    run = tmp_path / "run"
    shutil.copytree(runs["gloo"], run)
    (run / "comm_group.json").write_bytes(orjson.dumps({"0": [0], "1": [0, 1]}))
    for args in COMMANDS[1:]:
        code, said, _ = _answer(args, run)
        assert code == 1 and "comm_group.json" in said and "group '0'" in said, said
        assert "recorded for it (pg_config), not [0]" in said, said
