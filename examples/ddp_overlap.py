"""Data-parallel training as users run it: gradients all-reduced while backward goes on.

    python examples/ddp_overlap.py OUT --mode ddp --extra-mb 4

Two gloo ranks train 8 x (``Linear(512, 512)`` + ``Tanh``) on a fixed batch of 256, with one
extra parameter of ``--extra-mb`` MB that joins the loss at weight 0: its gradient is all-reduced
every step (more communication), the compute is unchanged. The PyTorch collector records steps
2-4 of 6. Modes:

- ``ddp``: torch's ``DistributedDataParallel`` (``bucket_cap_mb=1``): each bucket's all-reduce
  is launched from an autograd hook while backward goes on, and waited for before the step ends.
- ``no_sync``: the same with gradient accumulation, two micro-batches per step, the first under
  ``no_sync()`` (no communication), the second all-reducing.
- ``static_graph``: DDP with ``static_graph=True``.
- ``hooks``: no DDP; a ``register_post_accumulate_grad_hook`` on every parameter issues
  ``all_reduce(async_op=True)`` and the step ``wait()``s for all of them at its end.
- ``fsdp``: FSDP2, ``fully_shard`` on each layer and on the model: parameters all-gathered
  before each layer's forward and backward, gradients reduce-scattered after its backward.

Recording the same mode twice with different ``--extra-mb`` changes communication volume only,
so the ET of one run can be asked to predict the other (``chakra-hooks whatif --comm-from``).
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

WIDTH, LAYERS, BATCH, STEPS = 512, 8, 256, 6
MODES = ("ddp", "no_sync", "static_graph", "hooks", "fsdp")


class Net(nn.Module):
    def __init__(self, extra_mb: float) -> None:
        super().__init__()
        layers = []
        for _ in range(LAYERS):
            layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
        self.body = nn.Sequential(*layers)
        self.extra = nn.Parameter(torch.zeros(max(1, int(extra_mb * 2**20) // 4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The extra parameter joins the loss at weight 0: a gradient to all-reduce, no compute
        # worth counting (one multiply-add over it).
        return self.body(x).sum() + 0.0 * self.extra.sum()


def _hook_all_reduce(model: nn.Module, pending: list) -> None:
    def hook(p: torch.Tensor) -> None:
        pending.append(dist.all_reduce(p.grad, async_op=True))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = Net(args.extra_mb)
    batch = torch.randn(BATCH, WIDTH)
    pending: list = []
    if args.mode == "hooks":
        model: nn.Module = net
        _hook_all_reduce(net, pending)
    elif args.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in net.body:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        model = fully_shard(net)
    else:
        model = nn.parallel.DistributedDataParallel(
            net, bucket_cap_mb=1, static_graph=args.mode == "static_graph")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with chakra.trace(args.outdir, steps=range(2, 5)) as t:
        for _ in range(STEPS):
            opt.zero_grad()
            if args.mode == "no_sync":
                half = BATCH // 2
                with model.no_sync():
                    model(batch[:half]).backward()
                model(batch[half:]).backward()
            else:
                model(batch).backward()
            for work in pending:
                work.wait()
            pending.clear()
            opt.step()
            t.step()
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path, help="capture directory to write")
    p.add_argument("--mode", choices=MODES, default="ddp", help="how gradients are all-reduced")
    p.add_argument("--extra-mb", type=float, default=4.0,
                   help="size of the extra parameter whose gradient is all-reduced, MB (default 4)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    mp.spawn(worker, args=(args, free_port()), nprocs=2, join=True)


if __name__ == "__main__":
    main()
