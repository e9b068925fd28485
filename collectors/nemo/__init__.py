"""NeMo (Lightning) hooks: not built yet (no issue asks for them so far).

Traces that NeMo's profiling callbacks record (``host/rank-N.json`` + ``device/rank-N.json``)
convert post hoc: ``chakra-hooks convert`` (linker/pytorch_discover.py).
"""
