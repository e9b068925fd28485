"""Reading the sidecar files our collectors write beside the traces (routing bins, KV-cache
records): ``{"format": ..., "records": [{...}, ...]}``, each record with required keys."""

from __future__ import annotations

from pathlib import Path

import orjson

from chakra_hooks.common.errors import TraceFormatError, json_kind
from chakra_hooks.linker.model import LinkedTrace


def read_records(path: Path, fmt: str, what: str, required: tuple[str, ...]) -> list[dict]:
    """The records of a sidecar of format ``fmt``; TraceFormatError naming the file and the
    record for anything else (``what`` says what a record is, for the message)."""
    path = Path(path)
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise TraceFormatError(path, "open", f"a readable file ({exc.strerror})") from exc
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(path, f"byte {exc.pos}", f"JSON ({exc.msg})") from exc
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise TraceFormatError(path, "top level", f"an object with format {fmt!r}")
    records = doc.get("records")
    if not isinstance(records, list):
        raise TraceFormatError(path, "records", f"a list of {what}")
    for i, rec in enumerate(records):
        missing = [k for k in required if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise TraceFormatError(path, f"record {i}", f"keys {', '.join(missing)}")
    return records


def check_integers(path: Path, index: int, rec: dict, keys: tuple[str, ...], low: int = 0,
                   nullable: bool = False) -> None:
    """Each of ``keys`` in record ``index`` is an integer from ``low`` to 2^62 (absent reads
    as ``low``; null too when ``nullable``), else a TraceFormatError naming it."""
    for key in keys:
        value = rec.get(key, low)
        if value is None and nullable:
            continue
        if type(value) is not int or not low <= value < 1 << 62:
            raise TraceFormatError(path, f"record {index}", f"{key}: an integer from {low} to "
                                   f"2^62{' or null' if nullable else ''}, got {json_kind(value)}")


def recorded_ranges(trace: LinkedTrace) -> dict[str, list[tuple[int, int, str]]]:
    """The annotation ranges the device trace recorded (``LinkedTrace.annotations``), per name
    in time order, as (start ps, end ps, lane): the n-th range of a name is the n-th record of
    it in a sidecar."""
    found: dict[str, list[tuple[int, int, str]]] = {}
    for name, start, dur, lane in sorted(trace.annotations, key=lambda a: a[1]):
        found.setdefault(name, []).append((start, start + dur, lane))
    return found
