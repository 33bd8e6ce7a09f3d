"""One captured graph (a compiled frame) on its way through the stack.

A :class:`Frame` names the graph (``frame000``, ``frame001`` ... in the order graphs are
captured in this process, so names are the same from run to run), writes each stage to
the debug folder (``KILN_DEBUG``), times the stages for the ``perf`` log,
:func:`kiln.compile_times` and :func:`kiln.compile_timeline`, and reports progress while
a long compile runs.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import threading
import time
from collections import defaultdict, deque
from pathlib import Path
from time import perf_counter

from kiln import logs

# A compile running longer than this reports each stage it starts on the progress log.
PROGRESS_AFTER_S = 1.0

_lock = threading.Lock()
# the next frame number, per debug folder (None: frames that are not written anywhere)
_next_index: dict[Path | None, int] = defaultdict(int)
_cleaned_dirs: set[Path] = set()
# stage name -> seconds spent in it since the last kiln.reset(), over every frame
_totals: dict[str, float] = defaultdict(float)
TIMELINE_EVENTS = 10_000  # the stages compile_timeline() keeps, the latest
_timeline: deque[dict] = deque(maxlen=TIMELINE_EVENTS)
_FRAME_DIR = re.compile(r"frame\d{3,}")


def compile_timeline() -> list[dict]:
    """Each compile stage of this process (since ``kiln.reset()``, the latest
    :data:`TIMELINE_EVENTS`), in the order they ended: ``thread``, ``frame`` (its name and
    function), ``stage`` and what it said it did (``what``), ``start`` and ``end`` in seconds
    on :func:`time.perf_counter`'s clock. A stage opened inside another lies within it;
    stages of two threads (a training step's backward compiled ahead) overlap."""
    with _lock:
        return [dict(event) for event in _timeline]


def compile_times() -> dict[str, float]:
    """Seconds spent in each compile stage in this process (since ``kiln.reset()``).

    Stages: ``capture`` (bytecode capture, guards and the first run of a call that
    compiled), ``autograd`` (tracing the aten graphs and partitioning; on a warm start,
    rebuilding them from kiln-autograd's record), ``autograd_cache`` (reading and writing
    those records on disk), ``rewrite`` (the aten graphs' rewrites: padding, freezing,
    ...), kiln-loopir's ``lowering`` (decompositions, loop IR, constant
    folding), ``fusion`` (kernels, fusion, order) and ``memory`` (memory plan, kernel
    arguments), ``loopir`` (the rest of kiln-loopir: the Python host program), ``render``
    and ``build`` (the code generator), ``host`` (a native host program built after the
    kernels: planning and timing launches),
    ``cache_load`` (a graph found in the on-disk cache, a rewrite record read),
    ``runtime`` (mode plug-ins).
    """
    with _lock:
        return dict(_totals)


_frames_made = 0  # frames made in this process, to tell a call that compiled
# per thread: seconds charged to the stages of frames, and spent waiting on other threads'
_this_thread = threading.local()


# whether the latest call_timing_capture called a module in training mode (a flag, not the
# module: a module the user let go must not be kept alive here)
_called_in_training = False


def calling_a_module_in_training() -> bool:
    """Whether the call now capturing is of a module in training mode (whose backward
    will follow, as a rule)."""
    return _called_in_training


def _not_capture() -> float:
    """Seconds this thread spent in stages, or waiting for another thread's."""
    return getattr(_this_thread, "staged", 0.0)


@contextlib.contextmanager
def waiting_for_other_threads():
    """Time spent waiting for compiles another thread runs (and charges to its stages):
    not charged to ``capture`` either."""
    started = perf_counter()
    try:
        yield
    finally:
        _this_thread.staged = _not_capture() + perf_counter() - started


def call_timing_capture(fn, args, kwargs, what: object):
    """``fn(*args, **kwargs)``; when the call captured something, the time it took beyond
    the stages the frames timed is charged to ``capture`` (tracing the bytecode, building
    guards and code, and the first run) and logged on the ``perf`` log, naming ``what``
    (a label, or the module called)."""
    global _called_in_training
    _called_in_training = getattr(what, "training", False) is True
    made, staged = _frames_made, _not_capture()
    started = perf_counter()
    out = fn(*args, **kwargs)
    if _frames_made != made:
        elapsed = perf_counter() - started
        label = what if isinstance(what, str) else type(what).__qualname__
        capture = max(elapsed - (_not_capture() - staged), 0.0)
        with _lock:
            _totals["capture"] += capture
        logs.logger("perf").info(
            "%s: first call %.3f s, of which capture (and the first run) %.3f s",
            label,
            elapsed,
            capture,
        )
    return out


def reset_frames() -> None:
    with _lock:
        _next_index.clear()
        _totals.clear()
        _timeline.clear()
        _cleaned_dirs.clear()


def _clean_debug_dir(root: Path) -> None:
    """The first frame a process writes under ``root`` removes the frame folders an earlier
    run left there (only those: other files are the user's)."""
    if root in _cleaned_dirs:
        return
    _cleaned_dirs.add(root)
    if root.is_dir():
        for child in root.iterdir():
            if child.is_dir() and _FRAME_DIR.fullmatch(child.name):
                shutil.rmtree(child, ignore_errors=True)


class Frame:
    """A captured graph: its name, its debug folder, its stage times."""

    def __init__(self, debug_dir: str | None) -> None:
        root = Path(debug_dir).resolve() if debug_dir is not None else None
        global _frames_made
        with _lock:
            _frames_made += 1
            self.index = _next_index[root]
            _next_index[root] += 1
            if root is not None:
                _clean_debug_dir(root)
        self.name = f"frame{self.index:03d}"
        self.function = "?"  # the captured function's qualified name, once capture says
        self.ran_eagerly = False  # whether one of its graphs fell back to running eagerly
        self.folder: Path | None = None
        if root is not None:
            self.folder = root / self.name
            self.folder.mkdir(parents=True, exist_ok=True)
        self.started = time.perf_counter()
        self.times: dict[str, float] = defaultdict(float)
        self._threads = threading.local()  # per thread: the stages it has open
        self._files: set[str] = set()

    # --- debug files ------------------------------------------------------------

    def file_name(self, name: str) -> str:
        """``name``, or ``name`` with ``_2``, ``_3`` ... before its suffix when this frame
        already wrote it (a second signature of the same graph)."""
        if name not in self._files:
            self._files.add(name)
            return name
        stem, dot, suffix = name.partition(".")
        n = 2
        while f"{stem}_{n}{dot}{suffix}" in self._files:
            n += 1
        unique = f"{stem}_{n}{dot}{suffix}"
        self._files.add(unique)
        return unique

    def dump(self, name: str, text: str) -> Path | None:
        if self.folder is None:
            return None
        path = self.folder / name
        path.write_text(text if text.endswith("\n") else text + "\n")
        return path

    # --- stage times and progress -------------------------------------------------

    @property
    def _running(self) -> list[list]:
        """``[stage, started]`` of the stages this thread has open, innermost last (a
        backward compiled ahead times its stages in a thread of its own)."""
        running = getattr(self._threads, "running", None)
        if running is None:
            running = self._threads.running = []
        return running

    @property
    def _unlogged(self) -> dict[str, float]:
        """The stage times this thread charged since its last :meth:`log_perf`."""
        times = getattr(self._threads, "unlogged", None)
        if times is None:
            times = self._threads.unlogged = defaultdict(float)
        return times

    def _charge(self, stage: str, seconds: float) -> None:
        _this_thread.staged = _not_capture() + seconds
        self._unlogged[stage] += seconds
        with _lock:
            self.times[stage] += seconds
            _totals[stage] += seconds

    @contextlib.contextmanager
    def stage(self, stage: str, what: str = ""):
        """Time ``stage``; time spent in a stage opened inside it counts for the inner one."""
        now = time.perf_counter()
        self._pause_enclosing(now)
        told = bool(what) and now - self.started > PROGRESS_AFTER_S
        if told:
            logs.logger("progress").info("%s (%s): %s", self.name, self.function, what)
        self._running.append([stage, now])
        try:
            yield
        finally:
            name, started = self._running.pop()
            end = time.perf_counter()
            self._charge(name, end - started)
            self._note(stage, what, now, end)
            self._resume_enclosing(end)
            if told:  # a stage said to start says when it ended, and how long it took
                logs.logger("progress").info(
                    "%s (%s): %s: done in %.2f s", self.name, self.function, what, end - now
                )

    def _note(self, stage: str, what: str, start: float, end: float) -> None:
        event = {"thread": threading.current_thread().name, "frame": self.name,
                 "function": self.function, "stage": stage, "what": what,
                 "start": start, "end": end}  # fmt: skip
        with _lock:
            _timeline.append(event)

    @contextlib.contextmanager
    def waiting(self):
        """Time this thread spends waiting for another thread's compile, which times its
        own stages: charged to no stage (the enclosing one pauses) and not to ``capture``."""
        self._pause_enclosing(time.perf_counter())
        try:
            with waiting_for_other_threads():
                yield
        finally:
            self._resume_enclosing(time.perf_counter())

    def _pause_enclosing(self, now: float) -> None:
        """Charge this thread's innermost open stage up to ``now``."""
        if self._running:
            outer = self._running[-1]
            self._charge(outer[0], now - outer[1])

    def _resume_enclosing(self, now: float) -> None:
        """This thread's innermost open stage counts again from ``now``."""
        if self._running:
            self._running[-1][1] = now

    def log_perf(self, what: str) -> None:
        """Log the stage times this thread charged since its last call (a backward compiled
        ahead logs its own), then start counting afresh."""
        times = dict(self._unlogged)
        self._unlogged.clear()
        if logs.enabled("perf") and times:
            parts = ", ".join(f"{k} {v:.3f} s" for k, v in times.items())
            total = sum(times.values())
            logs.logger("perf").info("%s %s: %.3f s (%s)", self.describe(), what, total, parts)

    def describe(self) -> str:
        return f"{self.name} ({self.function})"
