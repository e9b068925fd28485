"""One 2-rank gloo training program whose only knob is how much it communicates.

    python examples/comm_volume.py OUT --extra-mb 64

Each step of each rank: 6 ``Linear(512, 512)`` layers forward and backward on a fixed batch,
then an all-reduce of an extra buffer of ``--extra-mb`` MB and one of every gradient (13
all-reduces in all), as a data-parallel step does. The PyTorch collector records steps 2-4 of
6. Recording it twice with different ``--extra-mb`` changes the world in one respect only
(communication volume), so the ET of one run can be asked to predict the other: see
``chakra-hooks whatif --comm-from`` and benchmarks/bench_model_time.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

import chakra_hooks.collectors.torch as chakra  # noqa: E402
from train_tiny_moe import free_port  # noqa: E402 (the example beside this one)

WIDTH, LAYERS, BATCH = 512, 6, 64


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    batch = torch.randn(BATCH, WIDTH)
    extra = torch.zeros(max(1, int(args.extra_mb * 2**20) // 4))
    with chakra.trace(args.outdir, steps=range(2, 5)) as t:
        for _ in range(6):
            model.zero_grad()
            model(batch).sum().backward()
            dist.all_reduce(extra)
            for p in model.parameters():
                dist.all_reduce(p.grad)
            t.step()
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path, help="capture directory to write")
    p.add_argument("--extra-mb", type=float, default=4.0,
                   help="size of the extra all-reduced buffer, MB (default 4)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    mp.spawn(worker, args=(args, free_port()), nprocs=2, join=True)


if __name__ == "__main__":
    main()
