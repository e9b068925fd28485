"""A 2-rank gloo training job that reports what is left of it at exit (not collected: no
test_ prefix). Used by tests/collectors/test_clean_exit.py.

    python gloo_exit_job.py OUTDIR traced|plain [amplify] [nn-import]

Each rank: 6 ``Linear(512)`` layers forward and backward, an all-reduce of a 4 MB buffer and
of every gradient, 6 steps (the torch collector around steps 2-4 when traced), then
``destroy_process_group()``; it prints its threads' names after that. ``amplify`` sets a 1 s
thread switch interval, which widens the race a gloo thread that outlives its group loses at
interpreter exit (std::terminate, SIGABRT). ``nn-import``: the program imports
``torch.distributed.nn`` after ``init_process_group``, which pins the default group whether
traced or not.
"""

from __future__ import annotations

import gc
import os
import socket
import sys

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def _threads() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(names)


def six_steps(step, outdir: str, traced: bool, **options) -> None:
    """Six calls of ``step``; ``traced``: the torch collector around steps 2-4 (``options``
    passed on to it)."""
    if traced:
        import chakra_hooks.collectors.torch as chakra

        with chakra.trace(outdir, steps=range(2, 5), **options) as t:
            for _ in range(6):
                step()
                t.step()
    else:
        for _ in range(6):
            step()


def spawn_two(rank_main, outdir: str, *args) -> None:
    """``rank_main(rank, outdir, port, *args)`` on ranks 0 and 1 (torch's spawn), on a free
    port."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(outdir, port, *args), nprocs=2)


def _rank(rank: int, outdir: str, port: int, traced: bool, amplify: bool,
          user_import: bool) -> None:
    if amplify:
        sys.setswitchinterval(1)
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if user_import:  # as a program using its autograd-aware collectives does
        import torch.distributed.nn  # noqa: F401  (its defaults capture the default group)
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(6)])
    batch, extra = torch.randn(64, 512), torch.zeros(2**20)

    def step() -> None:
        model.zero_grad()
        model(batch).sum().backward()
        dist.all_reduce(extra)
        for p in model.parameters():
            dist.all_reduce(p.grad)

    six_steps(step, outdir, traced)
    dist.destroy_process_group()
    gc.collect()
    print(f"rank {rank} threads after destroy: {' '.join(_threads())}", flush=True)


def main() -> None:
    outdir, mode = sys.argv[1], sys.argv[2]
    spawn_two(_rank, outdir, mode == "traced", "amplify" in sys.argv[3:],
              "nn-import" in sys.argv[3:])


if __name__ == "__main__":
    main()
