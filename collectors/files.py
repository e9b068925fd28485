"""Writing capture files from inside the user's job: atomically, so that a crash, a full disk or
a reader looking at the folder mid-run never sees half a file. Standard library only."""

from __future__ import annotations

import json
import os
from pathlib import Path


def temp_path(path: Path) -> Path:
    """A hidden sibling of ``path``, private to this process, to write before renaming."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write_text(path: Path, text: str, *, overwrite: bool = True) -> bool:
    """Write ``text`` to ``path`` via a temporary file in the same directory.

    With ``overwrite=False`` the file is only created if absent (returns False otherwise).
    """
    tmp = temp_path(path)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    try:
        if overwrite:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_json(path: Path, obj: object, *, overwrite: bool = True) -> bool:
    """``atomic_write_text`` of ``obj`` as indented, key-sorted JSON."""
    return atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True), overwrite=overwrite)
