"""A tiny expert-parallel MoE model trained on CPU ranks (gloo), recorded with chakra-hooks.

    python examples/train_tiny_moe.py out/run [--world-size 2] [--ep-size 2] [--steps 6]
    chakra-hooks convert out/run -o out/et

Each step of each rank runs: a broadcast (rank 0's data seed), a dense layer, an MoE layer
whose experts are spread over the expert-parallel (EP) group (the router's per-EP-rank counts
are exchanged with an all_to_all, then the token copies with all_to_all_single), a ring
send/recv, an all_reduce of the replicated gradients over the world, an all_gather of the
losses and a reduce_scatter of a statistic. With --world-size 4 --ep-size 2 the EP groups are
[0, 1] and [2, 3] and the expert-gradient groups [0, 2] and [1, 3].

The collector records steps 2 and 3 (``--window``) on every rank into the capture directory.
Random weights, no downloads; the model is built here.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

# torch's C++ side warns at every ET observer start and stop (4 lines for 2 ranks) unless told
# not to; read when torch loads, so set before importing it. A user's own setting wins.
# (Kineto's own 'USDT ... profiler_start' lines do not follow it.)
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

import chakra_hooks.collectors.torch as chakra  # noqa: E402

HIDDEN = 32
TOKENS = 16  # per rank per step
EXPERTS_PER_RANK = 2
TOP_K = 2


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its gradient is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, send_sizes, recv_sizes, group):
        ctx.sizes, ctx.group = (send_sizes, recv_sizes), group
        out = x.new_empty((sum(recv_sizes),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_sizes, send_sizes, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_sizes, recv_sizes = ctx.sizes
        return AllToAll.apply(grad, recv_sizes, send_sizes, ctx.group), None, None, None


class Router(nn.Module):
    """Top-k softmax router: returns (logits, weights [T, k], expert ids [T, k])."""

    def __init__(self, num_experts: int) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, num_experts, bias=False)

    def forward(self, x: torch.Tensor):
        logits = self.proj(x)
        weights, ids = torch.topk(logits.softmax(dim=-1), TOP_K, dim=-1)
        return logits, weights / weights.sum(dim=-1, keepdim=True), ids


class ExpertParallelMoE(nn.Module):
    """Experts 0..E-1 live contiguously on the EP ranks (EXPERTS_PER_RANK each)."""

    def __init__(self, ep_group, ep_size: int, ep_rank: int) -> None:
        super().__init__()
        self.group, self.ep_size, self.ep_rank = ep_group, ep_size, ep_rank
        self.num_experts = ep_size * EXPERTS_PER_RANK
        self.router = Router(self.num_experts)
        self.experts = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(EXPERTS_PER_RANK))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, weights, ids = self.router(x)
        flat_ids = ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        tokens = x.repeat_interleave(TOP_K, dim=0)[order]
        sorted_ids = flat_ids[order]
        send = torch.bincount(sorted_ids // EXPERTS_PER_RANK, minlength=self.ep_size)
        recv = torch.empty_like(send)
        # Per-destination counts first (all_to_all of one number per EP rank), then the tokens.
        recv_list = list(recv.split(1))
        dist.all_to_all(recv_list, list(send.split(1)), group=self.group)
        recv = torch.cat(recv_list)
        send_sizes, recv_sizes = send.tolist(), recv.tolist()
        out_ids = torch.empty(sum(recv_sizes), dtype=sorted_ids.dtype)
        dist.all_to_all_single(out_ids, sorted_ids, recv_sizes, send_sizes, group=self.group)
        got = AllToAll.apply(tokens, send_sizes, recv_sizes, self.group)
        local = out_ids - self.ep_rank * EXPERTS_PER_RANK
        done = torch.zeros_like(got)
        for e, expert in enumerate(self.experts):
            mask = (local == e).unsqueeze(-1)
            done = done + mask * expert(got)
        back = AllToAll.apply(done, recv_sizes, send_sizes, self.group)
        combined = torch.empty_like(back).index_copy(0, order, back)
        return (combined.view(-1, TOP_K, HIDDEN) * weights.unsqueeze(-1)).sum(dim=1)


class TinyMoEModel(nn.Module):
    def __init__(self, ep_group, ep_size: int, ep_rank: int) -> None:
        super().__init__()
        self.inp = nn.Linear(HIDDEN, HIDDEN)
        self.moe = ExpertParallelMoE(ep_group, ep_size, ep_rank)
        self.out = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        return self.out(h + self.moe(h))


def make_groups(rank: int, world: int, ep_size: int):
    """EP groups of consecutive ranks; expert-DP groups of ranks with the same EP position.
    Every rank must create every group, in the same order."""
    ep_groups = [dist.new_group(list(range(s, s + ep_size))) for s in range(0, world, ep_size)]
    dp_groups = [dist.new_group(list(range(p, world, ep_size))) for p in range(ep_size)]
    return ep_groups[rank // ep_size], dp_groups[rank % ep_size]


def train_step(model, opt, rank: int, world: int, step: int, ep_dp_group) -> float:
    seed = torch.tensor([1000 + step if rank == 0 else 0])
    dist.broadcast(seed, src=0)
    gen = torch.Generator().manual_seed(int(seed) * 31 + rank)
    x = torch.randn(TOKENS, HIDDEN, generator=gen)
    y = torch.randn(TOKENS, 1, generator=gen)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        expert = name.startswith("moe.experts.")
        group = ep_dp_group if expert else None
        dist.all_reduce(p.grad, group=group)
        p.grad /= dist.get_world_size(group)
    opt.step()
    # A ring exchange (point-to-point) of a small activation summary.
    ring = torch.full((4,), float(rank))
    got = torch.empty(4)
    if rank % 2 == 0:
        dist.send(ring, dst=(rank + 1) % world)
        dist.recv(got, src=(rank - 1) % world)
    else:
        dist.recv(got, src=(rank - 1) % world)
        dist.send(ring, dst=(rank + 1) % world)
    losses = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(losses, loss.detach().reshape(1))
    stats = torch.full((world * 2,), float(step))
    part = torch.zeros(2)
    dist.reduce_scatter(part, list(stats.chunk(world)))
    return float(torch.cat(losses).mean())


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(0)  # the same replicated weights everywhere
    ep_group, ep_dp_group = make_groups(rank, args.world_size, args.ep_size)
    model = TinyMoEModel(ep_group, args.ep_size, rank % args.ep_size)
    chakra.register_router(model.moe.router, num_experts=model.moe.num_experts, top_k=TOP_K,
                           name="moe.router", layer=0, ep_size=args.ep_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    window = range(args.window[0], args.window[1] + 1)
    ranks = None if args.ranks is None else [int(r) for r in args.ranks.split(",")]
    with chakra.trace(args.outdir, steps=window, ranks=ranks, model=model) as t:
        for step in range(args.steps):
            loss = train_step(model, opt, rank, args.world_size, step, ep_dp_group)
            if args.fail_at is not None and step == args.fail_at:
                raise RuntimeError(f"requested failure at step {step}")
            t.step()
    if rank == 0:
        print(f"rank 0: final mean loss {loss:.4f}; capture in {args.outdir}")
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path, help="capture directory to write")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--ep-size", type=int, default=2, help="expert-parallel group size")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--window", type=int, nargs=2, default=(2, 3), metavar=("FIRST", "LAST"))
    p.add_argument("--ranks", default=None, help="comma-separated ranks to record (default all)")
    p.add_argument("--fail-at", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.world_size % args.ep_size:
        p.error("--ep-size must divide --world-size")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    mp.spawn(worker, args=(args, free_port()), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
