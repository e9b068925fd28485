"""Save the optimised HLO of every module a profiling window executed, beside its .xplane.pb.

Two sources, in order:

1. the XSpace itself: its ``/host:metadata`` plane holds one event metadata per executed module
   (named ``<module>(<program id>)``) with a ``Hlo Proto`` stat, the serialized ``xla.HloProto``
   of the module as compiled. It is turned into text with jaxlib's ``XlaComputation``.
2. functions the user registered with ``Trace.register(fn, *args)``: their
   ``fn.lower(*args).compile().as_text()``, for profiles without that plane.

Every file is written atomically as ``<module>.<program id>.hlo.txt``; the manifest maps file
names to the module keys the XSpace uses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..files import atomic_write_text

SOURCE_XSPACE = "xspace /host:metadata Hlo Proto"
SOURCE_COMPILE = "jit lower().compile().as_text()"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


def sidecar_name(module_key: str) -> str:
    """``jit_f(123)`` -> ``jit_f.123.hlo.txt`` (no shell-unfriendly characters)."""
    return _UNSAFE.sub(".", module_key).strip(".") + ".hlo.txt"


def modules_from_xspace(xplane: Path) -> dict[str, bytes]:
    """Module key -> serialized HloModuleProto, from the profile's metadata plane."""
    from chakra_hooks.linker.xla import hlo_pb2
    from chakra_hooks.linker.xla.xspace import find_plane, read_xspace

    meta = find_plane(read_xspace(xplane), "/host:metadata")
    if meta is None or "Hlo Proto" not in meta.stat_ids:
        return {}
    proto_id = meta.stat_ids["Hlo Proto"]
    out: dict[str, bytes] = {}
    for md in meta.plane.event_metadata.values():
        for st in md.stats:
            if st.metadata_id == proto_id:
                wrapper = hlo_pb2.HloProto()
                wrapper.ParseFromString(st.bytes_value)
                # Re-serialising keeps the fields our schema does not name (unknown fields),
                # so jaxlib gets the whole HloModuleProto back.
                out[md.name] = wrapper.hlo_module.SerializeToString()
    return out


def hlo_text_from_proto(module_proto: bytes) -> str:
    from jax._src.lib import xla_client

    return xla_client.XlaComputation(module_proto).as_hlo_text()


def save_from_xspace(xplane: Path) -> dict[str, str]:
    """Write one text file per module found in the XSpace; returns {file name: module key}."""
    written: dict[str, str] = {}
    for key, proto in sorted(modules_from_xspace(xplane).items()):
        name = sidecar_name(key)
        atomic_write_text(xplane.parent / name, hlo_text_from_proto(proto))
        written[name] = key
    return written


def save_registered(folder: Path, registered: list[tuple[Any, tuple, dict]]) -> dict[str, str]:
    """Write ``fn.lower(*args, **kwargs).compile().as_text()`` for registered functions."""
    written: dict[str, str] = {}
    for fn, args, kwargs in registered:
        text = fn.lower(*args, **kwargs).compile().as_text()
        header = text.split("\n", 1)[0]
        module = header.split()[1].rstrip(",") if header.startswith("HloModule ") else "module"
        name = sidecar_name(module)
        atomic_write_text(folder / name, text)
        written[name] = module
    return written
