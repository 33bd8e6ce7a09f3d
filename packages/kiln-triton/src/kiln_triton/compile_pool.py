"""A pool of compile worker processes for Triton kernels.

Triton's front end (the kernel's AST to TTIR) is Python and holds the GIL, so threads
compile one kernel at a time for most of each compile. The pool runs
:mod:`kiln_triton.compile_worker` in separate Python processes instead: each compiles for
the target the parent names (they never touch CUDA) into Triton's on-disk cache, where the
parent's identical ``triton.compile`` call then finds the binary (see
:meth:`kiln_triton.launcher.TritonKernel.compile_job`).

The workers are started as fresh interpreters (``subprocess``, never ``fork``: the parent
holds a CUDA context, and a ``spawn``-ed child would run the user's ``__main__`` again),
as early as a compile begins (:func:`start_compile_workers`), so their start-up overlaps
with the parent's work; they live as long as the process and stop at its exit. A worker
that dies fails its job (the parent compiles that kernel itself) and is started again.

``$KILN_TRITON_COMPILE_WORKERS`` sets their number (default: the CPUs this process may run
on, at most 32); ``0`` compiles in threads instead.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future

from kiln_triton import compile_worker

log = logging.getLogger("kiln.triton")
MAX_DEFAULT_WORKERS = 32  # each worker holds Triton and its compiler (~150 MB)
START_ATTEMPTS = 2  # a worker that exits before it is ready this often is not started again
JOB_TIMES = 10_000  # the jobs job_times() keeps, the latest
_JOB_TIMES: deque[dict] = deque(maxlen=JOB_TIMES)
_TIMES_LOCK = threading.Lock()


class CompileWorkerError(RuntimeError):
    """A job the worker could not finish: its compile error, or the worker's exit."""


def job_times() -> list[dict]:
    """The compile workers' latest jobs (at most :data:`JOB_TIMES` of them), in the order
    they ended: the ``function`` compiled and its ``options``; ``submitted``, ``started``
    (a worker took it) and ``ended``, in seconds on :func:`time.perf_counter`'s clock; the
    worker's ``seconds`` and, of them, ``launcher`` (building Triton's launcher); ``failed``."""
    with _TIMES_LOCK:
        return [dict(times) for times in _JOB_TIMES]


def _note_job(job: dict, reply: dict | None, submitted: float, started: float, ended: float):
    times = {
        "function": job.get("function"),
        "options": job.get("options"),
        "submitted": submitted,
        "started": started,
        "ended": ended,
        "seconds": reply.get("seconds") if reply else None,
        "launcher": reply.get("launcher") if reply else None,
        "failed": reply is None,
    }
    with _TIMES_LOCK:
        _JOB_TIMES.append(times)


def worker_count() -> int:
    """``$KILN_TRITON_COMPILE_WORKERS``, else the CPUs this process may run on (at most
    :data:`MAX_DEFAULT_WORKERS`)."""
    configured = os.environ.get("KILN_TRITON_COMPILE_WORKERS")
    if configured is not None:
        return max(0, int(configured))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(cpus or 1, MAX_DEFAULT_WORKERS)


def _worker_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the Triton this one uses
    env.pop("TRITON_INTERPRET", None)  # workers compile; the interpreter compiles nothing
    env["CUDA_VISIBLE_DEVICES"] = ""  # and never open a CUDA context
    return env


class _Worker:
    """One worker process and the thread that hands it jobs, one at a time."""

    def __init__(self, jobs: queue.Queue) -> None:
        self.jobs = jobs
        self.process: subprocess.Popen | None = None
        self.failed_starts = 0
        self.thread = threading.Thread(target=self._serve, name="kiln-triton-compile", daemon=True)
        self._start_process()
        self.thread.start()

    def _start_process(self) -> None:
        self.ready = False  # until the process says it imported Triton and warmed up
        self.process = subprocess.Popen(
            [sys.executable, "-P", compile_worker.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_worker_environment(),
        )

    def _serve(self) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            job, future, submitted = item
            if future.set_running_or_notify_cancel():
                started = time.perf_counter()
                try:
                    reply = self._exchange(job)
                    future.set_result(reply)
                except Exception as exc:  # noqa: BLE001 - the job's caller reports it
                    reply = None
                    future.set_exception(exc)
                _note_job(job, reply, submitted, started, time.perf_counter())

    def _exchange(self, job: dict) -> dict:
        """Send ``job`` to the process (started again if it exited), wait for its reply."""
        if self.failed_starts >= START_ATTEMPTS:
            raise CompileWorkerError("the compile worker exits as it starts (see its stderr)")
        if self.process is None or self.process.poll() is not None:
            self._start_process()
        process = self.process
        request = pickle.dumps(job)  # whole, so that a job that does not pickle sends nothing
        try:
            if not self.ready:
                try:
                    pickle.load(process.stdout)  # type: ignore[arg-type]
                except EOFError:
                    self.failed_starts += 1
                    raise
                self.ready = True
            process.stdin.write(request)  # type: ignore[union-attr]
            process.stdin.flush()  # type: ignore[union-attr]
            reply = pickle.load(process.stdout)  # type: ignore[arg-type]
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            self.process = None  # started again for the next job
            code = process.wait()  # type: ignore[union-attr]
            raise CompileWorkerError(f"the compile worker exited ({code}): {exc!r}") from None
        if reply["error"] is not None:
            raise CompileWorkerError(reply["error"])
        return reply

    def stop(self, timeout: float) -> None:
        process = self.process
        if process is None:
            return
        try:
            process.stdin.close()  # type: ignore[union-attr]  # the worker exits at EOF
            process.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()


class CompileWorkers:
    """``workers`` compile processes sharing one queue of jobs (:meth:`submit`)."""

    def __init__(self, workers: int) -> None:
        self.pid = os.getpid()  # a forked child starts its own pool (see compile_workers)
        self._jobs: queue.Queue = queue.Queue()
        self._workers = [_Worker(self._jobs) for _ in range(workers)]
        self._closed = False

    def __len__(self) -> int:
        return len(self._workers)

    def __repr__(self) -> str:
        return f"CompileWorkers({len(self)})"

    @property
    def broken(self) -> bool:
        """Whether no worker can start (this process then compiles in threads)."""
        # all() of no workers is True: a pool that could start none is broken too
        return all(w.failed_starts >= START_ATTEMPTS for w in self._workers)

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process is not None]

    def submit(self, job: dict) -> Future:
        """A future of the worker's reply to ``job`` (``{"hash", "pid", "seconds"}``), or
        of a :class:`CompileWorkerError`."""
        if self._closed:
            raise RuntimeError("the compile workers were shut down")
        future: Future = Future()
        self._jobs.put((job, future, time.perf_counter()))
        return future

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the workers: queued jobs fail, a worker still compiling gets ``timeout``
        seconds to finish, then is killed."""
        if self._closed or os.getpid() != self.pid:
            return  # a forked child's copy: the workers are its parent's
        self._closed = True
        while True:
            try:
                _, future, _ = self._jobs.get_nowait()
            except queue.Empty:
                break
            if future.set_running_or_notify_cancel():
                future.set_exception(CompileWorkerError("the compile workers were shut down"))
        for _ in self._workers:
            self._jobs.put(None)
        for worker in self._workers:
            worker.thread.join(timeout)
            worker.stop(timeout)


_POOL: CompileWorkers | None = None
_POOL_LOCK = threading.Lock()


def compile_workers() -> CompileWorkers | None:
    """The process's compile workers, started on the first call (None while
    ``$KILN_TRITON_COMPILE_WORKERS`` is 0, read at each call, or where workers cannot
    start: this process then compiles in threads)."""
    global _POOL
    count = worker_count()
    if count == 0:
        return None
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            try:
                _POOL = CompileWorkers(count)
            except OSError as exc:  # no interpreter to start (an embedded Python)
                log.warning("compile workers not started (%s); compiling in threads", exc)
                _POOL = CompileWorkers(0)  # broken: none to start
            atexit.register(_POOL.shutdown)
        return None if _POOL.broken else _POOL


def start_compile_workers() -> None:
    """Start the compile workers now, so that they are ready when kernels are compiled
    (``TritonCodegen.begin_compile`` calls this as a graph starts lowering; a compile whose
    graphs all come from the cache starts none).
    Nothing is started where kernels are not compiled (no CUDA device, or Triton's
    interpreter)."""
    if compiles_for_gpu():
        compile_workers()


def compiles_for_gpu() -> bool:
    """Whether kernels are compiled here (a CUDA device, not Triton's interpreter)."""
    import torch

    from kiln_triton.device import INTERPRET

    return not INTERPRET and torch.cuda.is_available()
