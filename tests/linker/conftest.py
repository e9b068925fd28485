"""Fixtures of the linker tests: the real 2-rank gloo job (``gloo_traces``) is recorded once per
session by tests/conftest.py, which the converter's tests share."""
