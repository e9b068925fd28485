"""vLLM collector: a vLLM plugin switched on by vLLM's own profiler flags.

Installing ``chakra-hooks[vllm]`` declares the ``vllm.general_plugins`` entry point
``chakra_hooks`` (:func:`.plugin.register`). When vLLM's torch profiler records into a local
folder (``--profiler-config '{"profiler": "torch", "torch_profiler_dir": "runs/x"}'``, then
``/start_profile`` ... ``/stop_profile`` or ``LLM.start_profile()`` / ``stop_profile()``), each
worker also writes its host ET, MoE routing bins per engine step and a manifest beside vLLM's
Kineto trace (:mod:`.capture`); ``chakra-hooks convert runs/x`` then gives one Chakra ET per
worker rank. KV-cache loads and stores: :class:`.kv.ChakraKVConnector` (imported by vLLM from
``kv_connector_module_path``). Importing this package imports neither vLLM nor torch.
"""

from .plugin import register

__all__ = ["register"]
