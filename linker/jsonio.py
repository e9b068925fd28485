"""Read one JSON or gzipped-JSON trace file, once, with orjson.

Shared by the PyTorch ET and Kineto readers. Every failure becomes a one-line
:class:`TraceFormatError` naming the file, where it broke and what was expected.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import orjson

from chakra_hooks.errors import TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when they start with the gzip magic (whatever the suffix)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceFormatError(path, "open", f"a readable file ({exc.strerror})") from exc
    if data[:2] != GZIP_MAGIC:
        return data
    # One zlib pass (wbits 31 = gzip framing); a decompressobj lets us tell a truncated
    # stream (no end-of-stream marker) from a corrupt one and name the offset reached.
    inflater = zlib.decompressobj(31)
    try:
        out = inflater.decompress(data)
        # Concatenated gzip members (rare, but legal): keep inflating what is left.
        while inflater.unused_data:
            rest = inflater.unused_data
            inflater = zlib.decompressobj(31)
            out += inflater.decompress(rest)
    except zlib.error as exc:
        raise TraceFormatError(path, "gzip stream", f"valid gzip data ({exc})") from exc
    if not inflater.eof:
        raise TraceFormatError(
            path, f"gzip byte {len(data)}", "a complete gzip stream (the file is truncated)"
        )
    return out


def load_json(path: Path) -> tuple[object, int]:
    """Parse ``path`` (JSON or gzipped JSON); returns (document, uncompressed size in bytes)."""
    raw = read_bytes(path)
    if not raw.strip():
        raise TraceFormatError(path, "byte 0", "a JSON document (the file is empty)")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(path, f"byte {exc.pos}", f"valid JSON ({exc.msg})") from exc
    return doc, len(raw)
