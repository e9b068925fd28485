"""Multi-host JAX, as two JAX processes on this machine: `jax.distributed` on the CPU (gloo
collectives), 2 devices each, one sharded computation over all 4, recorded by our collector
into one folder and converted into global ranks 0-3."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="JAX is not installed here (pip install 'chakra-hooks[jax]')")

from chakra_hooks.convert import convert_paths  # noqa: E402
from chakra_hooks.converter import etio  # noqa: E402
from chakra_hooks.converter.targets.astra_sim import run_rules  # noqa: E402
from chakra_hooks.common.errors import TraceFormatError  # noqa: E402

PROGRAM = '''
import sys
import jax
process, port, outdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=process)
import numpy as np
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from chakra_hooks.collectors.jax_xla import trace

sharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), PartitionSpec("x"))

@jax.jit
def step(a):
    return jnp.sum(jnp.sin(a) @ jnp.cos(a).T) + a

x = jax.make_array_from_callback((8, 64), sharding, lambda i: np.ones((8, 64), np.float32)[i])
with trace(outdir, steps=(1, 2)) as t:
    for _ in range(4):
        x = (step(x) * 0.5).block_until_ready()
        t.step()
print("ids", [d.id for d in jax.local_devices()], "complete", t.complete, t.errors)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("multihost")
    script = work / "job.py"
    script.write_text(PROGRAM)
    outdir, port = work / "run", str(_free_port())
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, str(script), str(i), port, str(outdir)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in (0, 1)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert "complete True" in out, out
    return outdir


@pytest.mark.slow
def test_each_process_profiles_into_its_own_folder(two_processes: Path) -> None:
    # jax.profiler names a profile after the host: two processes of one host would write
    # one file. Each process's manifest gives its devices' global ids.
    for index in (0, 1):
        manifest = json.loads((two_processes / f"jax_manifest.p{index}.json").read_text())
        assert manifest["process_count"] == 2 and manifest["process_index"] == index
        [xspace] = manifest["files"]["xspace"]
        assert xspace.startswith(f"process_{index}/plugins/profile/")
        assert (two_processes / xspace).is_file()
    ids = [json.loads((two_processes / f"jax_manifest.p{i}.json").read_text())["local_device_ids"]
           for i in (0, 1)]
    assert len(set(ids[0]) | set(ids[1])) == 4


@pytest.mark.slow
def test_two_processes_convert_to_global_ranks_whose_collectives_pair(two_processes, tmp_path) -> None:
    result = convert_paths([two_processes], tmp_path / "full", progress=False)
    assert [r.rank for r in result.ranks] == [0, 1, 2, 3]  # not 0, 1, 2048, 2049; no clash
    ets = {r.rank: etio.read_et(tmp_path / "full" / r.files[0]).nodes for r in result.ranks}
    sequences = {rank: [(c.comm_type, c.size) for c in run_rules.collectives(nodes)] for rank, nodes in ets.items()}
    assert sequences[0] and all(seq == sequences[0] for seq in sequences.values())
    assert run_rules.check_run(ets, {}) == []
    convert_paths([two_processes], tmp_path / "astra", target="astra-sim", progress=False)
    astra = {r: etio.read_et(tmp_path / "astra" / f"chakra.{r}.et").nodes for r in range(4)}
    assert run_rules.check_run(astra, {}) == []


@pytest.mark.slow
def test_profiles_of_several_hosts_without_manifests_are_refused(two_processes, tmp_path) -> None:
    # The profiles alone name their devices by local ordinal and say nothing of which
    # process each host was: refused before any work, saying what would give the ranks.
    bare = tmp_path / "bare"
    for index in (0, 1):
        for xspace in (two_processes / f"process_{index}").rglob("*.xplane.pb"):
            target = bare / f"host{index}" / xspace.name
            target.parent.mkdir(parents=True)
            target.write_bytes(xspace.read_bytes())
    with pytest.raises(TraceFormatError, match="per-process manifests"):
        convert_paths([bare], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
