"""A 2-rank gloo DDP job that must exit (not collected: no test_ prefix). Used by
benchmarks/ddp_exit_hangs.py; its steps and its spawning are gloo_exit_job.py's.

    python ddp_exit_job.py OUTDIR traced|plain

Each rank: ``DistributedDataParallel`` (``bucket_cap_mb=1``) over 8 x (``Linear(512)`` + Tanh)
and an extra 4 MB parameter, 6 steps (the torch collector around steps 2-4 when traced), then
``destroy_process_group()`` and the model freed (as the frame holding it is cleared).
"""

from __future__ import annotations

import os
import sys

from gloo_exit_job import six_steps, spawn_two  # (beside this file, on sys.path as a script)

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def _rank(rank: int, outdir: str, port: int, traced: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers = []
            for _ in range(8):
                layers += [nn.Linear(512, 512), nn.Tanh()]
            self.body = nn.Sequential(*layers)
            self.extra = nn.Parameter(torch.zeros(2**20))  # 4 MB

        def forward(self, x):
            return self.body(x).sum() + self.extra.sum()

    def run() -> None:  # the model is freed as this frame is cleared, as a program's would be
        model = DistributedDataParallel(Model(), bucket_cap_mb=1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        batch = torch.randn(64, 512)

        def step() -> None:
            opt.zero_grad()
            model(batch).backward()
            opt.step()

        six_steps(step, outdir, traced, model=model)
        dist.destroy_process_group()

    run()
    print(f"rank {rank} done", flush=True)


def main() -> None:
    spawn_two(_rank, sys.argv[1], sys.argv[2] == "traced")


if __name__ == "__main__":
    main()
