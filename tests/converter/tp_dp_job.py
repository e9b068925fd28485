"""4 gloo ranks as tensor parallel 2 x data parallel 2 (groups {0, 1}, {2, 3} and {0, 2},
{1, 3}), recorded by our PyTorch collector: each step all-reduces an activation within its
tensor-parallel group and the gradients within its data-parallel group. Not collected (no
test_ prefix).

    python tp_dp_job.py OUTDIR PORT
"""

from __future__ import annotations

import os
import sys


def _rank_main(rank: int, world: int, outdir: str, port: str) -> None:
    import torch
    import torch.distributed as dist

    import chakra_hooks.collectors.torch as chakra

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # Described as Megatron describes its groups (scale grows the data-parallel ones).
    tp = [dist.new_group([0, 1], group_desc="TENSOR_MODEL_PARALLEL_GROUP"),
          dist.new_group([2, 3], group_desc="TENSOR_MODEL_PARALLEL_GROUP")][rank // 2]
    dp = [dist.new_group([0, 2], group_desc="DATA_PARALLEL_GROUP"),
          dist.new_group([1, 3], group_desc="DATA_PARALLEL_GROUP")][rank % 2]
    model = torch.nn.Linear(128, 128)
    with chakra.trace(outdir, steps=range(1, 3), model=model) as t:
        for _ in range(4):
            activation = model(torch.randn(16, 128))
            dist.all_reduce(activation.detach(), group=tp)
            activation.sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad, group=dp)
            t.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(4, sys.argv[1], sys.argv[2]), nprocs=4)
