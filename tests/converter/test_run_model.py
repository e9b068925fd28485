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
