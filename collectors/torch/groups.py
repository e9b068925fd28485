"""Which process group each collective ran on, recorded inside the capture window.

With NCCL, ``record_param_comms`` carries a collective's group; with gloo on the CPU nothing
does: the c10d op records its ProcessGroup argument as ``'<Object>'``. So, inside the window
only, the ``torch.distributed`` collectives are wrapped to run under a ``record_function``
range named ``chakra_pg:<pg_name>`` (the name torch gives the group, a key of the ET's
process-group table), which lands in the host ET and Kineto around the c10d op and which the
linker reads (``linker/pytorch/link.py``, ``GROUP_ANNOTATION``). Outside the window the
functions are torch's own. Calls through names bound before the window (``from
torch.distributed import all_reduce``) are not seen; their collectives keep "all ranks"
(``pg_name`` ""), without a warning yet.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

ANNOTATION_PREFIX = "chakra_pg:"
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "reduce",
               "gather", "scatter", "barrier", "send", "recv", "isend", "irecv")


class GroupAnnotator:
    """Wraps the collectives of ``torch.distributed`` for one window (see the module docs)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Callable]] = []

    def activate(self) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        for name in COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = _wrap(original, c10d)
            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    self._saved.append((module, name, original))
                    setattr(module, name, wrapped)

    def deactivate(self) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()


def _wrap(original: Callable, c10d: Any) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        name = _group_name(signature, args, kwargs, c10d)
        if name is None:
            return original(*args, **kwargs)
        import torch

        with torch.autograd.profiler.record_function(ANNOTATION_PREFIX + name):
            return original(*args, **kwargs)

    return collective


def _group_name(signature: inspect.Signature, args: tuple, kwargs: dict, c10d: Any) -> str | None:
    """torch's name of the group a call runs on (the default group when none is given)."""
    try:
        group = signature.bind_partial(*args, **kwargs).arguments.get("group")
        if group is None:
            group = c10d._get_default_group()
        return str(c10d._world.pg_names[group])
    except Exception:  # a private table of another torch release: leave the call unmarked
        return None
