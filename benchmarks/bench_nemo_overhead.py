"""What ChakraTraceCallback costs next to NeMo 2.7.3's own PytorchProfilerCallback.

A tiny Hugging Face Mixtral (tests/nemo_collector/lightning_job.py) trained by Lightning on one
CPU process, gradient accumulation 2, 12 optimizer steps; steps 4 and 5 recorded. Modes, each in
a fresh process: ``none`` (no callback), ``nemo`` (NeMo's callback, CPU activity only, same
window), ``ours``. Reports the median optimizer-step time before the window, inside it, of the
step that ends it (where files are written) and after it; median of ``--trials`` processes per
mode. Needs the ``nemo`` nox session's environment::

    .nox/nemo/bin/python benchmarks/bench_nemo_overhead.py --trials 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from child_runs import emit, run_child

REPO = Path(__file__).resolve().parent.parent
MODES = ("none", "nemo", "ours")
START, NUM, STEPS = 4, 2, 12


def _child(mode: str, folder: str) -> dict:
    import lightning.pytorch as pl
    import torch

    sys.path.insert(0, str(REPO / "tests" / "nemo_collector"))
    import lightning_job as job

    ends: list[float] = []

    class StepClock(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            while len(ends) < trainer.global_step:
                ends.append(time.perf_counter())

    callbacks: list = [StepClock()]
    if mode == "nemo":
        from nemo.lightning.pytorch.callbacks import PytorchProfilerCallback

        callbacks.insert(0, PytorchProfilerCallback(
            start_step=START, end_step=START + NUM - 1, trace_dir=folder,
            profiler_kwargs={"activities": [torch.profiler.ProfilerActivity.CPU]}))
    elif mode == "ours":
        from chakra_hooks.collectors.nemo import ChakraTraceCallback

        callbacks.insert(0, ChakraTraceCallback(folder, start_step=START, num_steps=NUM))
    kwargs = job.trainer_kwargs("auto", 1)
    kwargs["max_steps"] = STEPS
    trainer = pl.Trainer(callbacks=callbacks, **kwargs)
    t0 = time.perf_counter()
    trainer.fit(job.TinyMixtral(), job.loader())
    steps = [b - a for a, b in zip([t0] + ends, ends)]
    window = steps[START:START + NUM]
    # Not the first step (start-up), not the steps at the window's edges.
    return {"before_s": statistics.median(steps[1:START - 1]),
            "window_s": statistics.median(window),
            "edge_s": steps[START + NUM] if len(steps) > START + NUM else 0.0,
            "after_s": statistics.median(steps[START + NUM + 1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--child")
    ap.add_argument("--folder")
    args = ap.parse_args()
    if args.child:
        emit(_child(args.child, args.folder))
        return
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(args.trials):  # interleaved, so a slow period hits every mode alike
        for mode in MODES:
            results[mode].append(run_child(__file__, mode))
    print(f"optimizer-step time, tiny Mixtral, 1 CPU process, accumulation 2, window steps "
          f"{START}-{START + NUM - 1}; median of {args.trials} processes per mode")
    print(f"{'mode':<6} {'before ms':>10} {'in window ms':>13} {'window end ms':>14} "
          f"{'after ms':>9}")
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) * 1e3 for k in runs[0]}
        print(f"{mode:<6} {med['before_s']:>10.1f} {med['window_s']:>13.1f} "
              f"{med['edge_s']:>14.1f} {med['after_s']:>9.1f}")


if __name__ == "__main__":
    main()
