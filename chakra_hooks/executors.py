"""Where `convert`'s work runs: this machine's processes (the default), or a Ray cluster.

Both run the same two rounds of plain functions on plain arguments: one task per rank job
(:func:`chakra_hooks.convert.convert_job`), then, for ``--target astra-sim``, one task per rank
rewriting that rank's collectives (converter/targets/run_files.py ``rewrite_collectives``); the
driver only hands out job descriptions and gathers small results (summaries, the
collectives' nodes). Progress is counted in ranks in one bar: fractions of a job from local
workers, whole jobs from Ray.

Ray is the engine, not a dependency: it is imported only by :class:`RayExecutor`
(``pip install 'chakra-hooks[ray]'``).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.common.progress import reporting_to

# Peak memory of a job is about 1.5x its input (benchmarks/bench_convert.py); Ray is told a
# little more, and never less than a floor, so that a node is not handed more jobs than fit.
MEMORY_PER_INPUT_BYTE = 1.6
MEMORY_FLOOR = 256 * 2**20
RAY_RETRIES = 3  # a worker lost (killed, out of memory, node gone) is retried this often
RAY_CANCEL_WAIT_S = 30  # how long a failed run waits for its cancelled tasks to stop


class _Bar:
    """The progress bar's count: jobs done, in fractions (a job says how far it has come)."""

    def __init__(self, total: int, bar: object | None) -> None:
        self.bar = bar  # tqdm's, or None when no bar shows
        self.done = [0.0] * total

    @property
    def shown(self) -> bool:
        return self.bar is not None

    def job_at(self, index: int, fraction: float) -> None:
        if self.bar is None or fraction <= self.done[index]:
            return
        self.done[index] = fraction
        self.bar.n = round(sum(self.done), 2)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def progress_bar(total: int, progress_shown: bool | None) -> _Bar:
    """tqdm's bar when it will show (``progress_shown``, or by default when stderr is a
    terminal, as tqdm decides); tqdm (~60 ms to import) is not imported for nothing."""
    if progress_shown is False or (progress_shown is None and not sys.stderr.isatty()):
        return _Bar(total, None)
    from tqdm import tqdm

    return _Bar(total, tqdm(total=total, unit="rank", desc="convert", disable=False, leave=False))


_worker_queue = None  # in a worker process: where its jobs' progress goes (None: nowhere)


def _start_worker(queue: object) -> None:
    """A spawned worker's set-up: where its progress goes, and a quick exit."""
    global _worker_queue
    _worker_queue = queue
    # The pool's shutdown waits for each worker to exit, and Python's own teardown (every
    # module and object freed one by one) took 20 of the 30 ms that costs on 16 ResNet ranks.
    # A worker has nothing left to do by then: its results went back through the pool, and
    # multiprocessing has flushed its stdout and stderr.
    atexit.register(os._exit, 0)


def _reporting(index: int, func: Callable, *args: object) -> object:
    """``func(*args)`` in a worker process, its progress put on the queue as (index, fraction)."""
    queue = _worker_queue
    sink = None if queue is None else (lambda fraction: queue.put((index, fraction)))
    with reporting_to(sink):
        return func(*args)


class LocalExecutor:
    """A pool of spawned processes on this machine, or this process alone for one worker."""

    def __init__(self, workers: int, progress_shown: bool | None) -> None:
        self.workers = max(1, workers)
        self.progress_shown = progress_shown
        self._pool = None
        self._queue = None

    def _ensure_pool(self, bar: _Bar):
        if self._pool is None:
            # Imported here: a single rank converts in this process and needs neither
            # (importing them is ~15 ms of every start-up).
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn, not fork: convert may run inside a training process (the collectors'
            # convert=True), and forking a process with framework threads can deadlock.
            context = multiprocessing.get_context("spawn")
            self._queue = context.SimpleQueue() if bar.shown else None
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context,
                                             initializer=_start_worker, initargs=(self._queue,))
        return self._pool

    def map(self, func: Callable, argsets: Sequence[tuple], bar: _Bar | None = None) -> list:
        """``func(*args)`` for each of ``argsets``, results in order; progress to ``bar``."""
        bar = bar or _Bar(len(argsets), None)
        if self.workers <= 1 or len(argsets) <= 1:
            out = []
            for index, args in enumerate(argsets):
                with reporting_to(partial(bar.job_at, index) if bar.shown else None):
                    out.append(func(*args))
                bar.job_at(index, 1.0)
            return out
        from concurrent.futures import FIRST_COMPLETED, wait

        pool = self._ensure_pool(bar)
        queue = self._queue if bar.shown else None
        futures = {pool.submit(_reporting, index, func, *args): index
                   for index, args in enumerate(argsets)}
        results: list[Any] = [None] * len(argsets)
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2 if queue else None, return_when=FIRST_COMPLETED)
            while queue is not None and not queue.empty():
                bar.job_at(*queue.get())
            for future in done:
                results[futures[future]] = future.result()
                bar.job_at(futures[future], 1.0)
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class RayExecutor:
    """One Ray task per job, each declaring the memory it needs, on the cluster at
    ``address`` (else ``RAY_ADDRESS``, else a local Ray started for the run and stopped
    after it). Tasks read their inputs and write their outputs themselves: the paths must be
    ones every node sees (shared storage). A task whose worker died is retried by Ray; one
    that raised (bad input) is not, and its error is the run's."""

    def __init__(self, address: str | None, progress_shown: bool | None) -> None:
        try:
            import ray
        except ImportError:
            raise TraceFormatError("--executor ray", "Ray", "Ray installed (pip install "
                                   "'chakra-hooks[ray]')") from None
        self.ray = ray
        self.progress_shown = progress_shown
        self._started = not ray.is_initialized()
        if self._started:
            address = address or os.environ.get("RAY_ADDRESS") or None
            # A local Ray for the run when no cluster is named; quiet (its logs are not ours).
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        self._remote = ray.remote(max_retries=RAY_RETRIES, retry_exceptions=False)(_call)

    def map(self, func: Callable, argsets: Sequence[tuple], bar: _Bar | None = None,
            memory: Sequence[int] | None = None) -> list:
        ray = self.ray
        bar = bar or _Bar(len(argsets), None)
        refs = {}
        for index, args in enumerate(argsets):
            options = {"memory": int(memory[index])} if memory is not None else {}
            refs[self._remote.options(**options).remote(func, *args)] = index
        results: list[Any] = [None] * len(argsets)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=None)
                for ref in done:
                    results[refs[ref]] = ray.get(ref)
                    bar.job_at(refs[ref], 1.0)
        except ray.exceptions.RayTaskError as exc:
            for ref in pending:
                ray.cancel(ref, force=True)
            # A cancel returns before its worker has stopped, and a rank still converting may
            # write its staged files after the caller has removed the staging folder (and
            # make it, and the output folder, again): wait until every cancelled task ended.
            if pending:
                ray.wait(pending, num_returns=len(pending), timeout=RAY_CANCEL_WAIT_S)
            cause = getattr(exc, "cause", None)
            if isinstance(cause, (TraceFormatError, FileNotFoundError)):
                raise cause from None  # bad input: the one-line error naming its file
            raise
        return results

    def close(self) -> None:
        if self._started and self.ray.is_initialized():
            self.ray.shutdown()


def _call(func: Callable, *args: object) -> object:
    """What a Ray task runs (a module-level function, so Ray ships it by reference)."""
    return func(*args)


GZIP_RATIO = 8  # a remote gzip file's raw size is guessed (JSON traces compress ~6-12x)


def job_memory(job: object) -> int:
    """The memory one rank job is declared to need: its inputs' raw size x
    MEMORY_PER_INPUT_BYTE (a gzip file's raw size is in its last four bytes; a remote one's,
    which the driver does not read whole, is guessed at GZIP_RATIO x)."""
    remote = job.options.get("remote")
    if remote:
        size = sum(n * (GZIP_RATIO if url.endswith(".gz") else 1) for url, n in remote.values())
        return max(MEMORY_FLOOR, int(size * MEMORY_PER_INPUT_BYTE))
    size = 0
    for path in job.files.values():
        try:
            size += _raw_size(str(path))
        except OSError:
            pass
    return max(MEMORY_FLOOR, int(size * MEMORY_PER_INPUT_BYTE))


def _raw_size(path: str) -> int:
    size = os.path.getsize(path)
    if not path.endswith(".gz") or size < 18:
        return size
    with open(path, "rb") as handle:
        handle.seek(-4, os.SEEK_END)
        raw = int.from_bytes(handle.read(4), "little")  # ISIZE: the raw size modulo 2**32
    while raw < size:  # past 4 GiB the field wrapped; a raw size is never below the gzip's
        raw += 2**32
    return raw


def make_executor(name: str, workers: int | None, jobs: int, progress_shown: bool | None,
                  ray_address: str | None = None) -> LocalExecutor | RayExecutor:
    if name == "ray":
        return RayExecutor(ray_address, progress_shown)
    if name != "local":
        raise ValueError(f"unknown executor {name!r}; expected 'local' or 'ray'")
    return LocalExecutor(min(workers or os.cpu_count() or 1, jobs), progress_shown)
