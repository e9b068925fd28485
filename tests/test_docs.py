"""What the documents name exists: every `path/to/file.py:name` of docs/development.md (a file
of the repository, and a function, class or assignment of that name in it), and every file or
document a README or docs link points to."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# `collectors/torch/capture.py:trace`, `linker/sources.py`, `converter/targets/`
REFERENCE = re.compile(r"`((?:[\w.-]+/)+(?:[\w.-]+\.(?:py|pxd|toml|md))?)(?::(\w+))?`")


def _references(doc: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in REFERENCE.finditer((REPO / doc).read_text())]


def _defines(path: Path, name: str) -> bool:
    text = path.read_text()
    return re.search(rf"^\s*(?:def|class|cdef class)\s+{name}\b|^\s*{name}\s*[:=]", text,
                     re.MULTILINE) is not None


def test_development_guide_names_what_exists() -> None:
    refs = _references("docs/development.md")
    assert len(refs) > 40, "the guide should name the files it talks about"
    missing = []
    for rel, name in refs:
        if rel.startswith(("linker/nsys", "tests/nsys")):  # the worked example's new files
            continue
        path = REPO / rel
        if not path.exists():
            missing.append(rel)
        elif name is not None and not _defines(path, name):
            missing.append(f"{rel}:{name}")
    assert not missing, missing


def test_document_links_resolve() -> None:
    for doc in ("README.md", *(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))):
        base = (REPO / doc).parent
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", (REPO / doc).read_text()):
            assert (base / target).exists(), f"{doc} links to {target}, which does not exist"
