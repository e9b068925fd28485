"""The program each rank of the emulated cluster runs: data-parallel training on stand-in
layers (tests/cluster/stand_in.py), recorded by the PyTorch collector, one recording per phase
of a plan, all in the same processes.

    python tests/cluster/program.py PLAN.json

The plan (``tests/cluster/run.py`` writes it): ``{"out": DIR, "control": DIR, "per_host": G,
"phases": [...]}``; each phase ``{"name", "mode", "sizes", "forward_ms", "backward_ms",
"scale", "host_bytes", "steps", "window"}``:

- ``mode`` ``dp``: after backward, each layer's gradient all-reduced on its own, last layer
  first (sizes differ, so the recording pins down latency and bandwidth apart);
  ``ddp``: torch's ``DistributedDataParallel`` (1 MB buckets), whose all-reduces run while
  backward goes on;
- ``sizes``: each layer's parameter, bytes; ``scale``: rank -> factor of its layers' sleep (a
  straggler); ``host_bytes``: an all-reduce within each host's group per step (two tiers);
- the collector records steps ``window`` (``[first, end)``) of ``steps`` into ``OUT/<name>``.

Before each phase, rank 0 writes ``CONTROL/<name>.ready`` and waits for ``CONTROL/<name>.go``
(the harness sets the links meanwhile); then every rank meets at a barrier.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stand_in import Layer  # noqa: E402

import chakra_hooks.collectors.torch as chakra  # noqa: E402

READY_TIMEOUT_S = 600


def _wait_for_harness(control: Path, name: str) -> None:
    (control / f"{name}.ready").touch()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (control / f"{name}.go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the harness never answered {name}.ready")
        time.sleep(0.02)


def _phase(phase: dict, rank: int, out: Path, host_group) -> None:
    layers = [Layer(size, phase["forward_ms"], phase["backward_ms"]) for size in phase["sizes"]]
    for layer in layers:
        layer.scale = float(phase.get("scale", {}).get(str(rank), 1.0))
    model: nn.Module = nn.Sequential(*layers)
    ddp = phase["mode"] == "ddp"
    if ddp:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    host_buffer = torch.ones(max(1, int(phase.get("host_bytes", 0)) // 4))
    x = torch.ones(64, requires_grad=True)
    first, end = phase["window"]
    with chakra.trace(out / phase["name"], steps=range(first, end)) as t:
        for _ in range(phase["steps"]):
            for p in model.parameters():
                p.grad = None
            model(x).sum().backward()
            if not ddp:
                for layer in reversed(layers):
                    dist.all_reduce(layer.weight.grad)
            if host_group is not None and phase.get("host_bytes"):
                dist.all_reduce(host_buffer, group=host_group)
            t.step()
    if ddp:
        del model  # DDP's reducer is freed here, between phases, not at exit


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_host = int(plan.get("per_host") or world)
    host_group = None
    if per_host < world:  # every rank makes every group, in one order
        for h in range(world // per_host):
            group = dist.new_group(list(range(h * per_host, (h + 1) * per_host)))
            if rank // per_host == h:
                host_group = group
    out, control = Path(plan["out"]), Path(plan["control"])
    for phase in plan["phases"]:
        if rank == 0:
            _wait_for_harness(control, phase["name"])
        dist.barrier()
        _phase(phase, rank, out, host_group)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
