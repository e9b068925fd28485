"""A 2-rank gloo job recorded the way Megatron-Bridge's profiling records one: a
``torch.profiler.profile`` with an execution-trace observer on the ranks of
``profile_ranks`` only (its default: rank 0), the host ET at ``chakra/rank-<r>.json.gz`` and
Kineto at ``torch_profile/rank-<r>.json.gz`` (formats.md). Not collected (no test_ prefix).

    python megatron_bridge_job.py OUTDIR PORT [PROFILE_RANKS]   (e.g. "0" or "0,1")
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys

STEPS, START, END = 6, 2, 4  # profile_step_start / profile_step_end


def _rank_main(rank: int, world: int, outdir: str, port: str, profiled: list[int]) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    chakra, kineto = f"{outdir}/chakra", f"{outdir}/torch_profile"
    prof = et = None
    if rank in profiled:
        os.makedirs(chakra, exist_ok=True)
        os.makedirs(kineto, exist_ok=True)
        et = ExecutionTraceObserver().register_callback(f"{chakra}/rank-{rank}.json")
        prof = profile(activities=[ProfilerActivity.CPU], execution_trace_observer=et,
                       schedule=schedule(wait=START - 1, warmup=1, active=END - START, repeat=1),
                       on_trace_ready=lambda p: p.export_chrome_trace(
                           f"{kineto}/rank-{rank}.json.gz"))
        prof.start()
    for _ in range(STEPS):
        model(torch.randn(32, 256)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
        et.unregister_callback()
        with open(f"{chakra}/rank-{rank}.json", "rb") as src, \
                gzip.open(f"{chakra}/rank-{rank}.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(f"{chakra}/rank-{rank}.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    ranks = [int(r) for r in (sys.argv[3] if len(sys.argv) > 3 else "0").split(",")]
    mp.spawn(_rank_main, args=(2, sys.argv[1], sys.argv[2], ranks), nprocs=2)
