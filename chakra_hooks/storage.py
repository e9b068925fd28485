"""Inputs and outputs of `convert` on object stores: fsspec URLs (``s3://``, ``gs://``,
``file://``, ``memory://``, ...) beside local (or NFS) paths.

The driver never reads a remote trace whole. To find ranks it looks at a local stand-in of each
remote file: its first HEAD_BYTES (what the discoverers sniff; small files such as manifests
whole), and each job remembers its files' URLs (``job.options["remote"]``). The worker that
converts a job fetches its own files to a local temporary folder, converts, and uploads its ETs
into a staging prefix beside the output (``<out>/.chakra-hooks-<id>/``); the driver's commit
moves them into place once every rank has converted, or removes the prefix: all or nothing, as
with a local folder.

fsspec is imported only for a URL (``pip install 'chakra-hooks[remote]'``, plus the store's own
package: s3fs, gcsfs, ...).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from chakra_hooks.common.errors import TraceFormatError

HEAD_BYTES = 65536  # what linker/pytorch/discover.py sniffs
WHOLE_BELOW = 1 << 20  # files this small (manifests, sidecars) are copied whole
STAGING_PREFIX = ".chakra-hooks-"


def is_url(item: object) -> bool:
    return isinstance(item, str) and "://" in item


def filesystem(url: str) -> tuple[object, str]:
    """(fsspec filesystem, path within it) of ``url``; a one-line error without fsspec."""
    try:
        import fsspec
    except ImportError:
        raise TraceFormatError(url, "URL", "a local path, or fsspec installed for URLs "
                               "(pip install 'chakra-hooks[remote]')") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:  # an unknown scheme, or its package missing
        raise TraceFormatError(url, "URL", f"a URL fsspec can open ({exc})") from None


def _join(url: str, name: str) -> str:
    return url.rstrip("/") + "/" + name


# -- inputs -------------------------------------------------------------------------------------

def mirror_inputs(inputs: list[str], folder: Path) -> dict[Path, tuple[str, int]]:
    """Local stand-ins in ``folder`` for the remote ``inputs`` (files or prefixes): each file's
    first HEAD_BYTES, or all of it below WHOLE_BELOW, at its relative place. Returns stand-in
    (resolved) -> (URL of the real file, its size)."""
    found: dict[Path, tuple[str, int]] = {}
    for index, url in enumerate(inputs):
        fs, root = filesystem(url)
        if not fs.exists(root):
            raise FileNotFoundError(f"{url}: no such file or directory")
        if fs.isdir(root):
            files = [(p, Path(p).relative_to(root.rstrip("/"))) for p in sorted(fs.find(root))]
        else:
            files = [(root, Path(Path(root).name))]
        for path, rel in files:
            # named as the user named its folder (fsspec's own form may differ: memory:///)
            shown = _join(url, rel.as_posix()) if fs.isdir(root) else url
            if any(part.startswith(".") for part in rel.parts):
                continue  # hidden files, and staging prefixes of our own
            size = int(fs.size(path))
            local = folder / str(index) / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            with fs.open(path, "rb") as handle:
                local.write_bytes(handle.read(size if size < WHOLE_BELOW else HEAD_BYTES))
            found[local.resolve()] = (shown, size)
    return found


def remote_sizes(job: object) -> int | None:
    """Bytes of a remote job's files (None for a local job): for the memory it declares."""
    remote = job.options.get("remote")
    return sum(size for _, size in remote.values()) if remote else None


@contextmanager
def local_job(job: object) -> Iterator[object]:
    """The job with its files on this machine: a remote job's files are fetched (by the worker
    running it) into a temporary folder, removed afterwards."""
    remote = job.options.get("remote")
    if not remote:
        yield job
        return
    folder = Path(tempfile.mkdtemp(prefix="chakra-hooks-in-"))
    urls: dict[str, str] = {}  # local copy -> its URL, for errors
    try:
        files = dict(job.files)
        for role, (url, _) in remote.items():
            fs, path = filesystem(url)
            local = folder / role.replace(":", "_") / Path(path).name
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get(path, str(local))
            files[role] = local
            urls[str(local)] = url
        try:
            yield type(job)(job.format, files, job.rank, dict(job.options))
        except TraceFormatError as exc:
            if exc.path not in urls:
                raise
            # The one-line error names the file the user gave, not the worker's copy.
            raise TraceFormatError(urls[exc.path], exc.where, exc.expected) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- outputs ------------------------------------------------------------------------------------

LOCK_FILE = ".chakra-hooks.lock"


def claim_folder(out: Path, warn) -> Path:
    """Claim a local output folder for one convert: an exclusive lock file holding our pid and
    host. A lock whose process is gone (a convert killed with SIGKILL) is taken over, and the
    staging folders such converts left are removed, said. Raises TraceFormatError while
    another convert holds the folder. Returns the lock, for :func:`release_folder`."""
    import socket

    lock = out / LOCK_FILE
    me = f"{os.getpid()}@{socket.gethostname()}"
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read_lock(lock)
            if holder is None:
                continue  # released between our two looks
            if _alive(holder):
                raise TraceFormatError(out, "output folder", f"another convert (process "
                                       f"{holder}) is writing to it: wait for it to end, or "
                                       f"choose another folder") from None
            try:  # stale: moved aside in one step, so that of two converts only one takes it
                os.rename(lock, f"{lock}.{os.getpid()}.stale")
                os.unlink(f"{lock}.{os.getpid()}.stale")
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me)
        break
    for stale in sorted(out.glob(STAGING_PREFIX + "*")):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
            warn(f"{stale}: removed, the staging folder of a convert that did not finish")
    return lock


def release_folder(lock: Path) -> None:
    lock.unlink(missing_ok=True)


def _read_lock(lock: Path) -> str | None:
    try:
        return lock.read_text().strip() or "?"
    except FileNotFoundError:
        return None


def _alive(holder: str) -> bool:
    """Whether the process that wrote a lock still runs (one on another host: taken to)."""
    import socket

    pid, _, host = holder.partition("@")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def move_and_copy(staging: str, name: str, first: str, second: str) -> None:
    """In the staging folder (local or remote): ``name`` renamed ``first``, and copied to
    ``second``."""
    if not is_url(staging):
        if name != first:
            os.replace(os.path.join(staging, name), os.path.join(staging, first))
        shutil.copyfile(os.path.join(staging, first), os.path.join(staging, second))
        return
    fs, prefix = filesystem(staging)
    if name != first:
        fs.mv(f"{prefix}/{name}", f"{prefix}/{first}")
    fs.copy(f"{prefix}/{first}", f"{prefix}/{second}")


@contextmanager
def local_staging(staging: str) -> Iterator[str]:
    """A local folder to write into: ``staging`` itself, or for a remote staging prefix a
    temporary folder whose files are uploaded there at the end."""
    if not is_url(staging):
        yield staging
        return
    folder = tempfile.mkdtemp(prefix="chakra-hooks-out-")
    try:
        yield folder
        fs, prefix = filesystem(staging)
        for name in os.listdir(folder):
            fs.put(os.path.join(folder, name), _join(prefix, name))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A file to rewrite in place: ``path`` itself, or a remote file fetched and put back."""
    if not is_url(path):
        yield path
        return
    fs, remote = filesystem(path)
    folder = tempfile.mkdtemp(prefix="chakra-hooks-rw-")
    local = os.path.join(folder, Path(remote).name)
    try:
        fs.get(remote, local)
        yield local
        fs.put(local, remote)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class RemoteOutput:
    """The output folder of a conversion at a URL (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(url)
        self.staging_url: str | None = None
        self.created = False

    def names(self) -> list[str]:
        if not self.fs.isdir(self.root):
            return []
        return sorted(Path(p).name for p in self.fs.ls(self.root, detail=False)
                      if not Path(p).name.startswith(STAGING_PREFIX) and self.fs.isfile(p))

    def make_staging(self) -> str:
        self.created = not self.fs.exists(self.root)
        self.staging_url = _join(self.url, STAGING_PREFIX + uuid.uuid4().hex[:12])
        self.fs.makedirs(filesystem(self.staging_url)[1], exist_ok=True)
        return self.staging_url

    def write(self, name: str, data: bytes) -> None:
        self.fs.pipe(_join(filesystem(self.staging_url)[1], name), data)

    def commit(self, replaced: list[str]) -> None:
        staging = filesystem(self.staging_url)[1]
        staged = [Path(p).name for p in self.fs.ls(staging, detail=False)]
        for name in replaced:  # --overwrite: only our own files of the earlier conversion go
            if name not in staged:
                self.fs.rm(_join(self.root, name))
        for name in staged:
            self.fs.mv(_join(staging, name), _join(self.root, name))

    def cleanup(self, failed: bool) -> None:
        if self.staging_url is not None:
            staging = filesystem(self.staging_url)[1]
            if self.fs.exists(staging):
                self.fs.rm(staging, recursive=True)
        if failed and self.created and self.fs.exists(self.root) and not self.fs.ls(self.root):
            self.fs.rm(self.root, recursive=True)


@contextmanager
def replaced_whole(out: Path, purpose: str) -> Iterator[Path]:
    """A local folder to write a run into (``.<out>.<purpose>`` beside ``out``) that replaces
    ``out`` whole once the block ends; on any error, Ctrl-C included, it is removed and ``out``
    is left as it was (``share`` and ``scale``)."""
    staging = out.with_name(f".{out.name}.{purpose}")
    if staging.exists():  # left by a killed earlier run
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        yield staging
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
