"""A real 2-rank gloo job on CPU, recorded with the ExecutionTraceObserver and Kineto.

Run as ``python torch_gloo_job.py OUTDIR PORT``; writes ``et_rank<r>.json`` and
``kineto_rank<r>.json`` per rank. Used by the linker tests (not collected: no test_ prefix).
"""

from __future__ import annotations

import os
import sys


def _rank_main(rank: int, world: int, outdir: str, port: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    pair = dist.new_group([0, 1])
    et = ExecutionTraceObserver().register_callback(f"{outdir}/et_rank{rank}.json")
    model = torch.nn.Linear(64, 64)
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=et) as prof:
        for _ in range(2):
            with record_function("train_forward"):  # an annotation holding ops
                loss = model(torch.randn(8, 64)).sum()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            t = torch.ones(4)
            dist.broadcast(t, 0)
            gathered = [torch.zeros(4) for _ in range(world)]
            dist.all_gather(gathered, t)
            dist.all_reduce(t, group=pair)
            out = torch.empty(4)
            dist.all_to_all_single(out, torch.arange(4, dtype=torch.float32))
            dist.barrier()
            if rank == 0:
                dist.send(t, 1)
            else:
                dist.recv(t, 0)
    prof.export_chrome_trace(f"{outdir}/kineto_rank{rank}.json")
    et.unregister_callback()
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(2, sys.argv[1], sys.argv[2]), nprocs=2)
