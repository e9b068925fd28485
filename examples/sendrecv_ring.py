"""Point-to-point communication as pipelines use it: four gloo ranks pass activations round a ring.

    python examples/sendrecv_ring.py OUT --mb 4

Each step of each rank: 4 ``Linear(512, 512)`` layers forward on a fixed batch, then the rank
sends ``--mb`` MB to the next rank and receives as much from the one before
(``isend`` / ``irecv``, then ``wait`` on both), as a pipeline stage hands on its activations.
The PyTorch collector records steps 2-4 of 6.
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

WIDTH, LAYERS, BATCH, RANKS = 512, 4, 64, 4


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    torch.manual_seed(rank)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    batch = torch.randn(BATCH, WIDTH)
    elements = max(1, int(args.mb * 2**20) // 4)
    outgoing, incoming = torch.ones(elements), torch.empty(elements)
    with chakra.trace(args.outdir, steps=range(2, 5)) as t, torch.no_grad():
        for _ in range(6):
            outgoing[:1] = model(batch).sum()
            works = [dist.isend(outgoing, (rank + 1) % RANKS),
                     dist.irecv(incoming, (rank - 1) % RANKS)]
            for work in works:
                work.wait()
            t.step()
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path, help="capture directory to write")
    p.add_argument("--mb", type=float, default=4.0, help="MB each rank sends per step (default 4)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    mp.spawn(worker, args=(args, free_port()), nprocs=RANKS, join=True)


if __name__ == "__main__":
    main()
