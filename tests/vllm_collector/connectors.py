"""A KV connector for the tests, loaded by vLLM from ``kv_connector_module_path``: vLLM's
``ExampleConnector`` whose bound metadata cannot say how many slots it moves (asking raises),
to show that a failure while measuring leaves the transfers and vLLM alone."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector


class _Unmeasurable:
    def numel(self) -> int:
        raise RuntimeError("slot count unavailable")


class _Request:
    slot_mapping = _Unmeasurable()
    is_store = True


class _Metadata:
    requests = [_Request()]


class UnmeasurableConnector(ExampleConnector):
    def _get_connector_metadata(self):
        real = super()._get_connector_metadata()
        import inspect

        # ExampleConnector itself reads its metadata through this method too: only the
        # wrapper's questions (from chakra_hooks) get the unmeasurable answer.
        caller = inspect.stack()[1].frame.f_globals.get("__name__", "")
        return _Metadata() if caller.startswith("chakra_hooks") else real
