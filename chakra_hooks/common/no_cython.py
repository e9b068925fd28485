"""Cython's decorators and ``compiled`` where Cython is not installed (an install that runs the
compiled modules' sources as plain Python, linker/model.py): the decorators leave the class or
function as it is, and ``compiled`` is False."""

from __future__ import annotations

from types import SimpleNamespace


def _as_is(cls: type) -> type:
    return cls


def _directive(_value: object) -> object:
    return _as_is


cython = SimpleNamespace(cclass=_as_is, no_gc=_as_is, boundscheck=_directive, wraparound=_directive,
                         compiled=False)
