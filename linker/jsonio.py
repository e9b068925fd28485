"""Read one JSON or gzipped-JSON trace file, once (msgspec typed decoding or orjson).

Shared by the PyTorch ET and Kineto readers. Every failure becomes a one-line
:class:`TraceFormatError` naming the file, where it broke and what was expected.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import msgspec
import orjson

from chakra_hooks.common.errors import TraceFormatError

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


def decode(path: Path, raw: bytes, decoder: msgspec.json.Decoder, array_type: object = None
           ) -> object:
    """Decode ``raw`` with a typed msgspec decoder; a top-level array is decoded as
    ``array_type`` when given. Errors become one-line TraceFormatErrors."""
    first = _first_char(raw)
    if not first:
        raise TraceFormatError(path, "byte 0", "a JSON document (the file is empty)")
    try:
        if array_type is not None and first == b"[":
            return msgspec.json.decode(raw, type=array_type)
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(path, "structure", f"the expected layout ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, f"byte {exc.start}", "UTF-8 text (this byte is not: "
                               "the file is damaged)") from exc
    except msgspec.DecodeError as exc:
        text = str(exc)
        at = re.search(r"byte (\d+)", text)
        where = (f"byte {at.group(1)}" if at else
                 f"byte {len(raw)}" if "truncated" in text else "JSON")
        raise TraceFormatError(path, where, f"valid JSON ({text})") from exc


_SPACE = re.compile(rb"[ \t\r\n]*")


def _first_char(raw: bytes) -> bytes:
    """The first non-blank byte (b"" if none), without copying the whole file as
    ``raw.strip()`` would: that copy is as large as the file."""
    at = _SPACE.match(raw).end()
    return raw[at:at + 1]


def load_json(path: Path) -> tuple[object, int]:
    """Parse ``path`` (JSON or gzipped JSON); returns (document, uncompressed size in bytes)."""
    raw = read_bytes(path)
    if not _first_char(raw):
        raise TraceFormatError(path, "byte 0", "a JSON document (the file is empty)")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(path, f"byte {exc.pos}", f"valid JSON ({exc.msg})") from exc
    return doc, len(raw)
