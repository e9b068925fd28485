"""A 2-rank gloo training program whose last rank is a straggler: it does ``--slow`` times the
compute of the other per step.

    python examples/straggler.py OUT --slow 3

Each step: rank 0 runs forward and backward on one micro-batch of 512; the last rank on
``--slow`` micro-batches (gradient accumulation); then both all-reduce an extra buffer of
``--extra-mb`` MB and every gradient (one flattened buffer), as a data-parallel step does. The PyTorch collector
records steps 2-4 of 6. Recorded with ``--slow 3`` and ``--slow 1``, the two runs differ in one
respect (the last rank's compute), so the ET of one can be asked to predict the other:
``chakra-hooks whatif --ranks 1 --compute 0.33x`` (benchmarks/bench_straggler.py).
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

WIDTH, LAYERS, BATCH, STEPS = 512, 6, 512, 6


def _train(model: nn.Module, batch: torch.Tensor, extra: torch.Tensor, micro_batches: int,
           outdir: Path) -> None:
    with chakra.trace(outdir, steps=range(2, 5)) as t:
        for _ in range(STEPS):
            model.zero_grad()
            for _ in range(micro_batches):
                model(batch).sum().backward()
            dist.all_reduce(extra)
            # Every gradient in one all-reduce, as DDP's buckets do (fewer hand-offs between
            # gloo's threads, whose timing on a shared CPU varies from run to run).
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            for g, part in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(part.view_as(g))
            t.step()


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # a core per rank, as a GPU per rank: the ranks do not slow each other
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    batch = torch.randn(BATCH, WIDTH)
    extra = torch.zeros(max(1, int(args.extra_mb * 2**20) // 4))
    for index, slow in enumerate(args.slow):
        outdir = args.outdir if len(args.slow) == 1 else args.outdir / f"{index}-slow{slow}"
        _train(model, batch, extra, slow if rank == 1 else 1, outdir)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path, help="capture directory to write")
    p.add_argument("--slow", type=int, nargs="+", default=[3],
                   help="micro-batches of the last rank per step, against one (default 3); "
                        "several values record one run each, one after the other in the same "
                        "processes, into OUT/<i>-slow<N> (a shared machine's speed drifts between "
                        "launches by more than the runs differ)")
    p.add_argument("--extra-mb", type=float, default=1.0,
                   help="size of the extra all-reduced buffer, MB (default 1)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    mp.spawn(worker, args=(args, free_port()), nprocs=2, join=True)


if __name__ == "__main__":
    main()
