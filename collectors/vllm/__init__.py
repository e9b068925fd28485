"""vLLM hooks: not built yet (no issue asks for them so far).

Traces that vLLM's own profiler flags record (``..._rank<r>.<ns>.pt.trace.json.gz``) convert post
hoc: ``chakra-hooks convert`` (linker/pytorch_discover.py).
"""
