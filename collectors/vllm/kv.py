"""``ChakraKVConnector``: records vLLM's KV-cache loads and stores around the user's connectors.

Selected with vLLM's own configuration, wrapping the connectors the user already runs, the way
vLLM's ``MultiConnector`` does (it is one: loads come from the first child that has the
tokens, saves go to every child)::

    KVTransferConfig(
        kv_connector="ChakraKVConnector",
        kv_connector_module_path="chakra_hooks.collectors.vllm.kv",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": [
            {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}}]})

Like ``MultiConnector`` it needs vLLM's hybrid KV-cache manager off unless every child supports
it: vLLM turns it off by itself with a warning, and refuses the connector only when
``disable_hybrid_kv_cache_manager=False`` is set explicitly.

While vLLM's torch profiler records (and only then; otherwise each method is one global read
more than ``MultiConnector``'s), each worker-side transfer call runs inside a
``record_function`` range, so it shows in the host ET and in Kineto, and is written to the
capture's ``kv`` sidecar with its time, direction and bytes:

==================  ================  ====================================================
method              range             bytes
==================  ================  ====================================================
start_load_kv       ``kv:load``       slots the children load x bytes per slot, all layers
wait_for_layer_load ``kv:wait_load:layer<N>``  0 (a wait; only in steps that load)
save_kv_layer       ``kv:save:layer<N>``  slots the children store x that layer's bytes/slot
wait_for_save       ``kv:wait_save``  0 (a wait; only in steps that store)
==================  ================  ====================================================

Slots are read from the children's bound metadata where it lists requests with a
``slot_mapping`` and ``is_store`` (``ExampleConnector`` and its kind); otherwise a save counts
the slots attention wrote this step (``attn_metadata.slot_mapping``), and a load is not
recorded (its size is unknown). Bytes per slot come from the KV-cache tensors vLLM registers:
``tensor bytes / (blocks x block size)``. A failure while measuring is logged once and the
call goes through unmeasured; the children's own exceptions propagate as vLLM expects.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

from . import capture as capture_mod

log = logging.getLogger("chakra_hooks.collectors.vllm")
_LAYER_IN_NAME = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def _layer_index(layer_name: str) -> int:
    found = _LAYER_IN_NAME.search(layer_name)
    return int(found.group(1)) if found else -1


class ChakraKVConnector(MultiConnector):
    """``MultiConnector`` that measures the worker-side transfers (module docstring)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._block_size = int(getattr(vllm_config.cache_config, "block_size", 0) or 0)
        self._num_blocks = int(getattr(kv_cache_config, "num_blocks", 0) or 0)
        self._slot_bytes: dict[str, int] = {}
        self._step_loads = self._step_stores = False
        self._failed = False

    @property
    def _names(self) -> str:
        return "+".join(type(c).__name__ for c in self._connectors)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        super().register_kv_caches(kv_caches)
        for name, tensor in kv_caches.items():
            slots = self._num_blocks * self._block_size
            if slots and isinstance(tensor, torch.Tensor):
                self._slot_bytes[name] = tensor.numel() * tensor.element_size() // slots

    # -- what the children move ------------------------------------------------------------
    def _request_slots(self, store: bool) -> tuple[int, int] | None:
        """(slots, requests) the children's metadata lists for loading or storing, or None
        when no child's metadata lists requests with slot mappings."""
        slots = requests = 0
        known = False
        for child in self._connectors:
            try:
                metadata = child._get_connector_metadata()
            except Exception:  # unbound: the child has nothing this step
                continue
            listed = getattr(metadata, "requests", None)
            if not isinstance(listed, list):
                continue
            known = True  # this child says what it moves (an empty list: nothing this step)
            for request in listed:
                mapping = getattr(request, "slot_mapping", None)
                if mapping is None or not hasattr(request, "is_store"):
                    continue
                if bool(request.is_store) == store:
                    slots += int(mapping.numel() if hasattr(mapping, "numel") else len(mapping))
                    requests += 1
        return (slots, requests) if known else None

    # -- measured calls ----------------------------------------------------------------------
    def _measure(self, kind: str, range_name: str, layer_name: str, call: Any,
                 sizing: Any) -> Any:
        capture = capture_mod.current()
        if capture is None or self._failed:
            return call()
        try:
            size = sizing()
        except Exception as exc:
            self._fail(exc)
            return call()
        if size is None:  # nothing to move, nothing worth a node
            return call()
        start = time.time_ns()
        with torch.profiler.record_function(range_name):
            result = call()
        end = time.time_ns()
        nbytes, slots, requests = size
        capture.add_kv_record({
            "kind": kind, "range": range_name, "layer": _layer_index(layer_name),
            "layer_name": layer_name, "bytes": nbytes, "slots": slots, "requests": requests,
            "connector": self._names, "start_ns": start, "end_ns": end,
            "tid": threading.get_native_id(), "step": len(capture.steps) - 1,
        })
        return result

    def _fail(self, exc: Exception) -> None:
        self._failed = True
        log.warning("chakra-hooks: KV-cache records off for this worker: %s: %s",
                    type(exc).__name__, exc)

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        """A new step's metadata: whether its waits are worth recording."""
        super().bind_connector_metadata(connector_metadata)
        self._step_loads = self._step_stores = False
        if capture_mod.current() is None or self._failed:
            return
        try:
            self._step_loads = bool((self._request_slots(store=False) or (0, 0))[0])
            self._step_stores = bool((self._request_slots(store=True) or (1, 0))[0])
        except Exception as exc:
            self._fail(exc)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        def sizing() -> tuple | None:
            found = self._request_slots(store=False)
            if found is None:
                return None
            slots, requests = found
            if not slots:
                return None
            return slots * sum(self._slot_bytes.values()), slots, requests

        self._measure("load", "kv:load", "", lambda: super(ChakraKVConnector, self)
                      .start_load_kv(forward_context, **kwargs), sizing)

    def wait_for_layer_load(self, layer_name: str) -> None:
        index = _layer_index(layer_name)
        self._measure("wait_load", f"kv:wait_load:layer{index}", layer_name,
                      lambda: super(ChakraKVConnector, self).wait_for_layer_load(layer_name),
                      lambda: (0, 0, 0) if self._step_loads else None)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        def sizing() -> tuple | None:
            found = self._request_slots(store=True)
            if found is None:  # children keep no request list: what attention wrote
                mapping = getattr(attn_metadata, "slot_mapping", None)
                found = (int(mapping.numel()) if mapping is not None else 0, 0)
            slots, requests = found
            if not slots:
                return None
            return slots * self._slot_bytes.get(layer_name, 0), slots, requests

        index = _layer_index(layer_name)
        self._measure("store", f"kv:save:layer{index}", layer_name,
                      lambda: super(ChakraKVConnector, self).save_kv_layer(
                          layer_name, kv_layer, attn_metadata, **kwargs), sizing)

    def wait_for_save(self) -> None:
        self._measure("wait_save", "kv:wait_save", "",
                      lambda: super(ChakraKVConnector, self).wait_for_save(),
                      lambda: (0, 0, 0) if self._step_stores else None)
