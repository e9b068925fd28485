"""What the vLLM plugin costs: generation throughput and profiler stop time, per mode.

Modes, each run in a fresh process on a tiny Mixtral (random weights, built locally; vLLM on
CPU, in-process engine, eager):

- ``off``:        no profiler configured; our plugin loaded (what every user of the package has)
- ``no-plugin``:  no profiler, and our plugin not loaded (``VLLM_PLUGINS`` allow-list)
- ``vllm``:       vLLM's own torch profiler recording, without our plugin
- ``vllm+et``:    the same plus a bare ``ExecutionTraceObserver`` handed to vLLM's profile by
                  hand (what recording a host ET costs by itself: torch's price)
- ``ours``:       vLLM's torch profiler recording with our plugin (host ET, routing bins)

Reports tokens/s of ``generate`` (inside the profiling window where there is one), the time of
``stop_profile`` and the size of what was written; median of ``--trials`` processes per mode.
Needs vLLM (the ``vllm`` nox session's environment)::

    .nox/vllm/bin/python benchmarks/bench_vllm_overhead.py --trials 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from child_runs import emit, run_child

REPO = Path(__file__).resolve().parent.parent
MODES = ("no-plugin", "off", "vllm", "vllm+et", "ours")


def _one(mode: str, model: str, folder: str, prompts: int, tokens: int) -> dict:
    """One measurement in this process (run by the parent as a subprocess)."""
    from vllm import LLM, SamplingParams

    sys.path.insert(0, str(REPO / "examples"))
    from tiny_models import prompt

    if mode == "vllm+et":
        _hand_made_observer(folder)
    profiler = None
    if mode in ("vllm", "vllm+et", "ours"):
        profiler = {"profiler": "torch", "torch_profiler_dir": folder,
                    "torch_profiler_with_stack": False}
    llm = LLM(model=model, enforce_eager=True, dtype="float32", max_model_len=256,
              kv_cache_memory_bytes=64 << 20, block_size=32, seed=0, profiler_config=profiler)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    batch = [prompt(i * 13, 24) for i in range(prompts)]
    llm.generate(batch[:1], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    if profiler:
        llm.start_profile()
    t0 = time.perf_counter()
    out = llm.generate(batch, params, use_tqdm=False)
    gen = time.perf_counter() - t0
    stop = 0.0
    if profiler:
        t0 = time.perf_counter()
        llm.stop_profile()
        stop = time.perf_counter() - t0
    made = sum(len(o.outputs[0].token_ids) for o in out)
    written = sum(p.stat().st_size for p in Path(folder).glob("*") if p.is_file())
    return {"tokens_per_s": made / gen, "generate_s": gen, "stop_s": stop,
            "written_mb": written / 1e6}


def _hand_made_observer(folder: str) -> None:
    """An ExecutionTraceObserver in vLLM's profile without our plugin (in-process engine)."""
    from torch.profiler import ExecutionTraceObserver
    from vllm.profiler.wrapper import TorchProfilerWrapper

    start, stop = TorchProfilerWrapper._start, TorchProfilerWrapper._stop

    def _start(self) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        self._et = ExecutionTraceObserver().register_callback(f"{folder}/et.json")
        self._profiler_kwargs["execution_trace_observer"] = self._et
        start(self)

    def _stop(self) -> None:
        stop(self)
        self._et.unregister_callback()

    TorchProfilerWrapper._start, TorchProfilerWrapper._stop = _start, _stop


def _run(mode: str, model: str, prompts: int, tokens: int) -> dict:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    if mode in ("no-plugin", "vllm", "vllm+et"):
        env["VLLM_PLUGINS"] = "none"  # an allow-list naming no installed plugin
    return run_child(__file__, mode, "--model", model, "--prompts", str(prompts), "--tokens",
                     str(tokens), env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--child")
    ap.add_argument("--model")
    ap.add_argument("--folder")
    args = ap.parse_args()
    if args.child:
        emit(_one(args.child, args.model, args.folder, args.prompts, args.tokens))
        return
    sys.path.insert(0, str(REPO / "examples"))
    from tiny_models import build_mixtral

    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_mixtral(Path(tmp) / "mixtral"))
        results: dict[str, list[dict]] = {m: [] for m in MODES}
        for _ in range(args.trials):  # interleaved, so a slow period hits every mode alike
            for mode in MODES:
                results[mode].append(_run(mode, model, args.prompts, args.tokens))
    print(f"{args.prompts} prompts x {args.tokens} tokens, median of {args.trials} "
          "processes per mode (tiny Mixtral, CPU, eager)")
    print(f"{'mode':<10} {'tokens/s':>9} {'generate s':>11} {'stop s':>7} {'written MB':>11}")
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{mode:<10} {med['tokens_per_s']:>9.1f} {med['generate_s']:>11.3f} "
              f"{med['stop_s']:>7.2f} {med['written_mb']:>11.2f}")


if __name__ == "__main__":
    main()
