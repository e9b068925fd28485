"""The JAX collector on real JAX (CPU, 4 forced host devices, shard_map collectives), then
`convert` end to end: 4 ETs whose collectives agree across devices.

JAX reads XLA_FLAGS when it is imported, so every JAX program runs in its own subprocess.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from fuzz_cases import FUZZ, convert_property, damage_bytes, damage_lines
from hypothesis import given
from hypothesis import strategies as st

from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import etio, validate
from chakra_hooks.converter.attrs import attr_dict, value_of
from chakra_hooks.converter.schema import NodeType
from chakra_hooks.linker.xla import hlo, xspace

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                reason="jax is not installed (pip install chakra-hooks[jax])")

PROGRAM = r'''
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import chakra_hooks.collectors.jax_xla as cj
from chakra_hooks.collectors.jax_xla import hlo_dump

outdir, mode = sys.argv[1], sys.argv[2]
mesh = Mesh(np.array(jax.devices()), ("x",))

def body(a):
    s = jax.lax.psum(a, "x")
    g = jax.lax.all_gather(a, "x")
    r = jax.lax.psum_scatter(g.reshape(-1, a.shape[-1]), "x", tiled=True)
    t = jax.lax.all_to_all(a, "x", 0, 0, tiled=True)
    p = jax.lax.ppermute(a, "x", [(i, (i + 1) % 4) for i in range(4)])
    return jnp.tanh(s + r[: a.shape[0]] + t + p)

f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
if mode == "busy":  # someone else's profiler session is running: ours cannot start
    jax.profiler.start_trace(outdir + "_other")
try:
    with cj.trace(outdir, steps=range(1, 3)) as t:
        for i in range(4):
            if mode == "raise" and i == 2:
                raise ValueError("boom in step 2")
            x = f(x).block_until_ready()
            t.step()
except ValueError as exc:
    print("user exception:", type(exc).__name__, exc)
if mode == "busy":
    jax.profiler.stop_trace()
if mode == "ok":  # the fallback source of HLO text, for a profile without /host:metadata
    print("registered:", sorted(hlo_dump.save_registered(__import__("pathlib").Path(outdir), [(f, (x,), {})])))
print("complete:", t.complete, t.errors)
'''


def run_program(tmp_path: Path, mode: str) -> tuple[Path, str]:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    outdir = tmp_path / "run"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(script), str(outdir), mode], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return outdir, proc.stdout


def _manifest(outdir: Path) -> dict:
    return json.loads((outdir / "jax_manifest.json").read_text())


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return run_program(tmp_path_factory.mktemp("jaxrun"), "ok")


@pytest.mark.slow
def test_capture_writes_profile_hlo_and_manifest(captured: tuple[Path, str]) -> None:
    outdir, stdout = captured
    m = _manifest(outdir)
    assert m["framework"] == "jax" and m["complete"] is True and m["errors"] == []
    assert m["steps"] == [1, 2] and m["steps_requested"] == [1, 3]
    assert len(m["devices"]) == 4 and m["versions"]["jax"] and m["local_device_ids"] == [0, 1, 2, 3]
    assert m["hlo_source"] == "xspace /host:metadata Hlo Proto"
    [xplane] = m["files"]["xspace"]
    assert (outdir / xplane).is_file()
    hlo_files = m["files"]["hlo"]
    assert any(key.startswith("jit_body(") for key in hlo_files.values())
    for rel, key in hlo_files.items():
        module = hlo.parse_hlo_text((outdir / rel).read_text())
        assert key.startswith(module.name + "(")
    assert "registered: ['jit_body.hlo.txt']" in stdout


@pytest.mark.slow
def test_steps_are_annotated(captured: tuple[Path, str]) -> None:
    outdir, _ = captured
    [xplane] = _manifest(outdir)["files"]["xspace"]
    cpu = xspace.find_plane(xspace.read_xspace(outdir / xplane), "/host:CPU")
    steps = []
    for line in cpu.lines():
        for mid, _, _, stats in cpu.events(line):
            if cpu.event_name(mid) == "train":
                steps.append(int(cpu.stats(stats)["step_num"]))
    assert sorted(steps) == [1, 2]


def _comm_nodes(path: Path) -> list[tuple[str, dict]]:
    et = etio.read_et(path)
    out = []
    for node in et.nodes:
        if node.type in (NodeType.Value("COMM_COLL_NODE"), NodeType.Value("COMM_SEND_NODE"),
                         NodeType.Value("COMM_RECV_NODE")):
            out.append((NodeType.Name(node.type), {k: value_of(v) for k, v in attr_dict(node).items()}))
    return out


@pytest.mark.slow
def test_convert_gives_four_agreeing_ets(captured: tuple[Path, str], tmp_path: Path) -> None:
    outdir, _ = captured
    result = convert_paths([outdir], tmp_path / "et", workers=1, progress=False)
    assert [r.rank for r in result.ranks] == [0, 1, 2, 3]
    groups = json.loads(result.comm_group.read_text())
    colls, p2p = {}, {}
    for r in result.ranks:
        path = tmp_path / "et" / r.files[0]
        et = etio.read_et(path)
        assert validate.validate(str(path), et.metadata, et.nodes).ok
        assert validate.validate(str(path), et.metadata, et.nodes, target="astra-sim").ok
        nodes = _comm_nodes(path)
        colls[r.rank] = Counter((a["comm_type"], a["comm_size"], a["pg_name"])
                                for t, a in nodes if t == "COMM_COLL_NODE")
        p2p[r.rank] = [(t, a["comm_src"], a["comm_dst"], a["comm_size"], a["comm_tag"])
                       for t, a in nodes if t != "COMM_COLL_NODE"]
        # data dependencies from HLO operands: the received permute result feeds a compute node
        kinds = {n.id: n.type for n in et.nodes}
        assert any(kinds[d] == NodeType.Value("COMM_RECV_NODE") for n in et.nodes for d in n.data_deps
                   if n.type == NodeType.Value("COMP_NODE"))
    # all four agree in count, type, size and group; 4 collectives x 2 recorded steps
    assert colls[0] == colls[1] == colls[2] == colls[3]
    assert sum(colls[0].values()) == 8 and len({k[0] for k in colls[0]}) == 4
    for _, _, pg in colls[0]:
        assert groups[pg] == [0, 1, 2, 3]
    # ppermute ring: every send has its receive on the target, with the same size and tag
    sends = sorted((s, d, size, tag) for r in p2p for t, s, d, size, tag in p2p[r] if t == "COMM_SEND_NODE")
    recvs = sorted((s, d, size, tag) for r in p2p for t, s, d, size, tag in p2p[r] if t == "COMM_RECV_NODE")
    assert sends == recvs and len(sends) == 8
    assert {(s, d) for s, d, _, _ in sends} == {(i, (i + 1) % 4) for i in range(4)}


@pytest.mark.slow
def test_tracing_problem_is_logged_not_raised(tmp_path: Path) -> None:
    outdir, stdout = run_program(tmp_path, "busy")
    assert "complete: False" in stdout
    m = _manifest(outdir)
    assert m["complete"] is False and any("starting jax.profiler" in e for e in m["errors"])


@pytest.mark.slow
def test_user_exception_propagates_and_window_is_closed(tmp_path: Path) -> None:
    outdir, stdout = run_program(tmp_path, "raise")
    assert "user exception: ValueError boom in step 2" in stdout
    m = _manifest(outdir)
    assert m["complete"] is False and any("ValueError: boom in step 2" in e for e in m["errors"])
    assert m["steps"] == [1, 2] and len(m["files"]["xspace"]) == 1  # what was recorded is kept


def test_importing_the_collector_and_linker_does_not_import_jax() -> None:
    code = ("import sys, chakra_hooks.collectors.jax_xla, chakra_hooks.linker.xla.link, "
            "chakra_hooks.linker.xla.discover; print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@given(data=st.data())
@FUZZ
def test_damaged_hlo_dumps(captured: tuple[Path, str], tmp_path_factory, data) -> None:
    """The collector's HLO text dumps, damaged (lines dropped, duplicated, cut or altered; bytes
    flipped): a conversion still succeeds or ends in one TraceFormatError line."""
    import shutil

    outdir, _ = captured
    folder = tmp_path_factory.mktemp("hlofuzz") / "run"
    shutil.copytree(outdir, folder)
    name = data.draw(st.sampled_from(sorted(_manifest(folder)["files"]["hlo"])))
    path = folder / name
    if data.draw(st.booleans()):
        path.write_text(damage_lines(path.read_text(), data))
    else:
        path.write_bytes(damage_bytes(path.read_bytes(), data))
    convert_property(folder, folder.parent / "out")


def test_shared_capture_reveals_no_names(captured: tuple[Path, str], tmp_path: Path) -> None:
    """`chakra-hooks share` on our JAX capture: no word or id of its profile, HLO dumps and
    manifest (function, module and file names among them) is in the shared files."""
    from chakra_hooks.converter.share import Options, check, share_run

    outdir, _ = captured
    convert_paths([outdir], tmp_path / "et", workers=1, progress=False)
    share_run(tmp_path / "et", tmp_path / "shared", b"0123456789abcdef" * 4, Options())
    found = check(tmp_path / "shared", [outdir])
    assert not found.leaks and found.searched > 50, found.leaks[:5]
