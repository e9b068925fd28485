"""Find XSpace profiles among the inputs of ``convert``.

Claims every ``*.xplane.pb`` (one job per file: a file holds all devices of one host), whether
it sits in JAX's ``<log_dir>/plugins/profile/<session>/<host>.xplane.pb`` layout or anywhere
else, plus what belongs to it: the JSON twin JAX writes beside it (``<host>.trace.json.gz``,
claimed so that no Chrome-trace reader mistakes it for Kineto), the HLO text sidecars our
collector saves beside it (``*.hlo.txt``), and the collector's run manifest
(``jax_manifest.json`` in the log dir).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.sources import RankJob

XPLANE_SUFFIX = ".xplane.pb"
HLO_SUFFIX = ".hlo.txt"
MANIFEST_GLOB = "jax_manifest*.json"  # jax_manifest.json, or jax_manifest.p<i>.json per process
# <outdir>/[process_<i>/]plugins/profile/<session>/: up to four levels below the manifests
_MANIFEST_DEPTH = 5


def discover(files: list[Path], warn: Callable[[str], None]) -> tuple[list[RankJob], set[Path]]:
    jobs: list[RankJob] = []
    claimed: set[Path] = set()
    for xplane in (f for f in files if f.name.endswith(XPLANE_SUFFIX)):
        job = RankJob(format="xla", files={"xspace": xplane})
        claimed.add(xplane)
        host = xplane.name[: -len(XPLANE_SUFFIX)]
        twin = xplane.with_name(host + ".trace.json.gz")
        if twin.exists():
            claimed.add(twin)
        manifest_path = _find_manifest(xplane)
        manifest = _read_manifest(manifest_path, warn) if manifest_path else {}
        if manifest_path is not None:
            claimed.add(manifest_path)
            job.files["manifest"] = manifest_path
            for key in ("hlo_source", "complete", "local_device_ids"):
                if key in manifest:
                    job.options[key] = manifest[key]
            ids = [d.get("id") for d in manifest.get("devices") or [] if isinstance(d, dict)]
            if ids and all(isinstance(i, int) for i in ids):
                job.options["device_ids"] = sorted(ids)  # every process's: ranks are places here
            job.options["manifest"] = str(manifest_path)
        module_keys = manifest.get("hlo_modules", {}) if isinstance(manifest.get("hlo_modules"), dict) else {}
        for sidecar in sorted(xplane.parent.glob("*" + HLO_SUFFIX)):
            key = module_keys.get(sidecar.name) or sidecar.name[: -len(HLO_SUFFIX)]
            job.files[f"hlo:{key}"] = sidecar
            claimed.add(sidecar)
        jobs.append(job)
    _refuse_hosts_without_ids(jobs)
    return jobs, claimed


def _refuse_hosts_without_ids(jobs: list[RankJob]) -> None:
    """Several profiles, not all with our collector's manifest: each names its devices by
    local ordinal (0, 1, ...), so the ranks would clash, and which host is which process of
    the run is written nowhere in a profile. Refused before any work, saying what is needed."""
    if len(jobs) < 2 or all("local_device_ids" in job.options for job in jobs):
        return
    names = ", ".join(str(job.files["xspace"]) for job in jobs[:4]) + (" ..." if len(jobs) > 4 else "")
    raise TraceFormatError(names, f"{len(jobs)} XSpace profiles",
                           "one profile, or the profiles of one multi-process JAX run with the "
                           "per-process manifests of the chakra-hooks JAX collector (they give "
                           "each device its global rank; a profile names only local ordinals); "
                           "profiles of different runs are converted one run at a time")


def _find_manifest(xplane: Path) -> Path | None:
    """The nearest collector manifest above the file; with one per process, the one that
    lists this file."""
    folder = xplane.parent
    for _ in range(_MANIFEST_DEPTH):
        candidates = sorted(p for p in folder.glob(MANIFEST_GLOB) if p.is_file())
        if len(candidates) == 1:
            return candidates[0]
        for candidate in candidates:
            rel = str(xplane.relative_to(folder))
            try:
                if rel in orjson.loads(candidate.read_bytes()).get("files", {}).get("xspace", []):
                    return candidate
            except (OSError, orjson.JSONDecodeError, AttributeError):
                continue
        if folder.parent == folder:
            break
        folder = folder.parent
    return None


def _read_manifest(path: Path, warn: Callable[[str], None]) -> dict:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as err:
        warn(f"{path}: unreadable run manifest, converting without it ({err})")
        return {}
    if not isinstance(data, dict):
        warn(f"{path}: run manifest is not a JSON object, converting without it")
        return {}
    return data
