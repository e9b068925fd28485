"""Per-step overhead of the PyTorch collector on a small MoE training loop (CPU).

    python benchmarks/bench_collector_overhead.py [--steps 40] [--trials 5] [--json out.json]

Modes, interleaved trial by trial so that machine noise hits them alike:
  none            no profiling
  torch.profiler  plain torch.profiler.profile (CPU activity; CUDA too when present)
  torch.prof+ET   the same plus an ExecutionTraceObserver (what the collector records)
  outside         our trace() with its window far in the future (hooks must cost nothing)
  inside          our trace() recording every measured step, routing bins off
  inside+bins     the same with routing bins on (4 routers per step)

Per-step time is this thread's CPU time (time.thread_time; wall time was too noisy on a shared
2-core machine), the median over a trial's steps (window start and end excluded: they pay the
profiler start-up and the file export, reported separately as "window end s"); across trials
the table shows the minimum (least disturbed by other processes) and the median. "noise" is the
spread (max - min) of the per-trial medians of the "none" mode, relative to its median.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import chakra_hooks.collectors.torch as ct

HIDDEN, TOKENS, EXPERTS, TOP_K, LAYERS = 128, 256, 8, 2, 4


class Router(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, EXPERTS, bias=False)

    def forward(self, x):
        w, ids = torch.topk(self.proj(x).softmax(-1), TOP_K, dim=-1)
        return w, ids


class MoELayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = Router()
        self.experts = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(EXPERTS))

    def forward(self, x):
        w, ids = self.router(x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = (ids == e).any(-1).nonzero().squeeze(-1)
            if sel.numel():
                gate = (w * (ids == e)).sum(-1, keepdim=True)[sel]
                out = out.index_add(0, sel, gate * expert(x[sel]))
        return x + out


def build():
    torch.manual_seed(0)
    model = nn.Sequential(*[MoELayer() for _ in range(LAYERS)], nn.Linear(HIDDEN, 1))
    for i, layer in enumerate(model[:LAYERS]):
        ct.register_router(layer.router, num_experts=EXPERTS, top_k=TOP_K, layer=i)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def one_step(model, opt) -> None:
    x = torch.randn(TOKENS, HIDDEN)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _activities():
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


def _timed(model, opt, steps: int, after_step) -> list[float]:
    """Per-step CPU time of this thread (with one intra-op thread all work runs here, and
    unlike wall time it barely moves when other processes compete for the cores)."""
    times = []
    for _ in range(steps):
        t0 = time.thread_time()
        one_step(model, opt)
        after_step()
        times.append(time.thread_time() - t0)
    return times


def run_mode(mode: str, model, opt, steps: int, tmp: Path) -> tuple[list[float], float]:
    """Per-step seconds of the measured steps, and the window-end (export) seconds.
    For our modes, also stores the recorded host-ET nodes per step in NODES_PER_STEP."""
    from torch.profiler import ExecutionTraceObserver, profile

    if mode == "none":
        return _timed(model, opt, steps, lambda: None)[1:-1], 0.0
    if mode in ("torch.profiler", "torch.prof+ET"):
        et = None
        if mode == "torch.prof+ET":
            et = ExecutionTraceObserver()
            et.register_callback(str(tmp / "et.json"))
        prof = profile(activities=_activities(), execution_trace_observer=et)
        prof.start()
        times = _timed(model, opt, steps, prof.step)
        t0 = time.perf_counter()
        prof.stop()
        prof.export_chrome_trace(str(tmp / "kineto.json"))
        if et is not None:
            et.unregister_callback()
        return times[1:-1], time.perf_counter() - t0
    if mode == "outside":
        with ct.trace(tmp, steps=range(10**9, 10**9 + 1)) as t:
            return _timed(model, opt, steps, t.step)[1:-1], 0.0
    routing = mode == "inside+bins"
    with ct.trace(tmp, steps=range(1, steps), routing=routing, model=model) as t:
        times = _timed(model, opt, steps - 1, t.step)  # steps 0 .. steps-2
        one_step(model, opt)
        t0 = time.perf_counter()
        t.step()  # end of step steps-1: the window ends here (stop, export, manifests)
        end_s = time.perf_counter() - t0  # wall time: includes the file writes
    assert t.complete, f"{mode}: capture incomplete"
    nodes = len(json.loads((tmp / "host_et.rank0.json").read_text())["nodes"])
    NODES_PER_STEP[mode] = nodes / (steps - 1)
    return times[2:-1], end_s


NODES_PER_STEP: dict[str, float] = {}


MODES = ["none", "torch.profiler", "torch.prof+ET", "outside", "inside", "inside+bins"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)  # steadier timings on a shared machine
    model, opt = build()
    _timed(model, opt, 10, lambda: None)  # warm the allocator and kernels
    per_trial: dict[str, list[float]] = {m: [] for m in MODES}
    end_s: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.trials):
        for mode in MODES:
            gc.collect()  # the previous mode's profiler results must not be freed mid-trial
            _timed(model, opt, 3, lambda: None)
            with tempfile.TemporaryDirectory() as d:
                times, e = run_mode(mode, model, opt, args.steps, Path(d))
            per_trial[mode].append(statistics.median(times))
            end_s[mode].append(e)
    report(per_trial, end_s, args)
    step_call_overhead(statistics.median(per_trial["none"]))


def step_call_overhead(step_s: float, calls: int = 200_000) -> None:
    """Outside the window the collector's only work is ``t.step()``: time that call alone."""
    with tempfile.TemporaryDirectory() as d:
        with ct.trace(d, steps=range(10**9, 10**9 + 1)) as t:
            t0 = time.perf_counter()
            for _ in range(calls):
                t.step()
            per_call = (time.perf_counter() - t0) / calls
    print(f"outside the window: t.step() costs {per_call * 1e9:.0f} ns per step "
          f"({per_call / step_s * 100:.4f}% of a {step_s * 1e3:.1f} ms step)")


def _pct(a: float, b: float) -> float:
    return (a / b - 1) * 100


def report(per_trial: dict, end_s: dict, args) -> None:
    med = {m: statistics.median(v) for m, v in per_trial.items()}
    low = {m: min(v) for m, v in per_trial.items()}
    noise = (max(per_trial["none"]) - min(per_trial["none"])) / med["none"] * 100
    rows = {m: {"min_ms": low[m] * 1e3, "median_ms": med[m] * 1e3,
                "min_vs_none_pct": _pct(low[m], low["none"]),
                "window_end_s": statistics.median(end_s[m])} for m in MODES}
    pairs = {"outside vs none": ("outside", "none"),
             "inside vs torch.profiler+ET": ("inside", "torch.prof+ET"),
             "inside vs torch.profiler": ("inside", "torch.profiler"),
             "bins on top of inside": ("inside+bins", "inside")}
    ratios = {k: {"min_pct": _pct(low[a], low[b]), "median_pct": _pct(med[a], med[b])}
              for k, (a, b) in pairs.items()}
    print(f"torch {torch.__version__}, {args.trials} trials x {args.steps} steps, "
          f"{LAYERS} MoE layers x {EXPERTS} experts, {TOKENS} tokens; noise(none) {noise:.1f}%")
    print(f"{'mode':<16}{'min ms':>9}{'median ms':>11}{'min vs none':>13}{'window end s':>14}")
    for m, r in rows.items():
        print(f"{m:<16}{r['min_ms']:>9.3f}{r['median_ms']:>11.3f}{r['min_vs_none_pct']:>+12.1f}%"
              f"{r['window_end_s']:>14.3f}")
    for k, r in ratios.items():
        print(f"{k:<30} min {r['min_pct']:+6.1f}%   median {r['median_pct']:+6.1f}%")
    # Profiler cost is roughly per recorded op: the bins' share of the recorded ops is a
    # noise-free proxy for their overhead.
    extra = _pct(NODES_PER_STEP["inside+bins"], NODES_PER_STEP["inside"])
    print(f"host-ET nodes per step: inside {NODES_PER_STEP['inside']:.0f}, inside+bins "
          f"{NODES_PER_STEP['inside+bins']:.0f} ({extra:+.1f}%)")
    ratios["bins extra ET nodes"] = {"pct": extra, **NODES_PER_STEP}
    if args.json:
        args.json.write_text(json.dumps({"noise_pct": noise, "modes": rows, "ratios": ratios},
                                        indent=1))


if __name__ == "__main__":
    main()
