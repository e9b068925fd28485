"""vLLM end to end: a tiny Mixtral (random weights, built here) served by vLLM on the CPU with
vLLM's own profiler flags and our KV connector around vLLM's ExampleConnector, then converted.

    pip install 'chakra-hooks[vllm]'   # then remove torchvision torchaudio torchcodec (see docs/recording.md)
    python examples/vllm_tiny_moe.py out/vllm

Writes ``out/vllm/model`` (the model), ``out/vllm/traces`` (per worker: vLLM's Kineto trace,
our host ET, routing bins, KV records, manifest) and ``out/vllm/chakra`` (one Chakra ET per
worker rank), and prints the summary and ``chakra-hooks stats``. The same prompt runs twice with
the prefix cache emptied in between, so the second run loads its KV back through the connector
(MEM_LOAD nodes) that the first stored (MEM_STORE nodes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process: starts in seconds
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local


def main(out: Path) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from chakra_hooks.cli import cli
    from tiny_models import build_mixtral, prompt

    model = build_mixtral(out / "model")
    kv = KVTransferConfig(
        kv_connector="ChakraKVConnector",
        kv_connector_module_path="chakra_hooks.collectors.vllm.kv",
        kv_role="kv_both", kv_connector_extra_config={"connectors": [
            {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"shared_storage_path": str(out / "kv-store")}}]})
    llm = LLM(model=str(model), dtype="float32", enforce_eager=True, max_model_len=256,
              block_size=32, kv_cache_memory_bytes=64 << 20, kv_transfer_config=kv,
              disable_hybrid_kv_cache_manager=True,
              profiler_config={"profiler": "torch", "torch_profiler_dir": str(out / "traces"),
                               "torch_profiler_with_stack": False})
    params = SamplingParams(max_tokens=8, temperature=0)
    llm.start_profile()
    first = llm.generate([prompt(0, 40), prompt(50, 20)], params, use_tqdm=False)
    llm.reset_prefix_cache()
    again = llm.generate([prompt(0, 40)], params, use_tqdm=False)
    llm.stop_profile()
    print("tokens:", list(first[0].outputs[0].token_ids), "== again:",
          list(again[0].outputs[0].token_ids) == list(first[0].outputs[0].token_ids))
    for args in (["convert", str(out / "traces"), "-o", str(out / "chakra"), "--overwrite"],
                 ["stats", str(out / "chakra")]):
        cli.main(args, standalone_mode=False)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_models beside this file
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/vllm"))
