"""A run of N ranks made of the corpus's 8 DLRM ranks (ET + Kineto each): rank r is a copy of
rank r % 8 under its own number (the ET's file name; the Kineto trace's file name and its
``distributedInfo``). For scale tests and benchmarks of `convert` over many ranks."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson

DLRM = Path("pytorch") / "v100_dlrm_8rank"


def tile_dlrm(corpus: Path, folder: Path, ranks: int) -> Path:
    folder.mkdir(parents=True)
    source = corpus / DLRM
    for rank in range(ranks):
        shutil.copy(source / f"dlrm_eg_{rank % 8}.json.gz", folder / f"dlrm_eg_{rank}.json.gz")
        kineto = orjson.loads(gzip.decompress(next(source.glob(f"worker{rank % 8}_step_12.*")).read_bytes()))
        kineto["distributedInfo"] = dict(kineto["distributedInfo"], rank=rank, world_size=ranks)
        (folder / f"worker{rank}_step_12.pt.trace.json.gz").write_bytes(
            gzip.compress(orjson.dumps(kineto), compresslevel=1))
    return folder
