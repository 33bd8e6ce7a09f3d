"""Where a first call's compile stages spend their time: every thread's Python stack,
sampled every few milliseconds while the call runs, summed over the windows of the
compile timeline (``bench_compile.timeline``).

:class:`StackSampler` samples (a daemon thread reading ``sys._current_frames``; it takes
the GIL for a moment each time, so the call runs a few percent slower). :func:`profile_text`
gives, for each stage of the timeline that lasted ``least`` seconds or more, and for the
main thread before the first stage (capture) and after the last one (the first run; with the
threads Python did not start, where autograd runs a CUDA backward), the
functions most often on that thread's stack then: the share of the window's samples each
was on the stack (the enclosing calls on nearly every sample left out), then the innermost
frames.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter

UNNAMED = "?"  # a thread Python did not start (autograd's device threads)
ENCLOSING = 0.95  # a function on this share of a window's samples or more encloses it


def frame_name(code) -> str:
    """``package/module.py:function`` for a code object (the path after ``site-packages/``
    or ``src/``)."""
    path = code.co_filename
    for marker in ("site-packages/", "/src/"):
        if marker in path:
            path = path.rsplit(marker, 1)[1]
            break
    return f"{path}:{code.co_name}"


class StackSampler:
    """Samples every other thread's stack each ``interval`` seconds until :meth:`stop`."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.samples: list[tuple[float, str, tuple[str, ...]]] = []  # (time, thread, stack)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack sampler", daemon=True)

    def start(self) -> StackSampler:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, str, tuple[str, ...]]]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            now = time.perf_counter()
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                stack = []
                while frame is not None:
                    stack.append(frame_name(frame.f_code))
                    frame = frame.f_back
                self.samples.append((now, names.get(ident, UNNAMED), tuple(stack)))


def window_text(label: str, stacks: list[tuple[str, ...]], top: int = 10) -> list[str]:
    """``label`` and the functions most often on ``stacks`` (innermost first in each)."""
    if not stacks:
        return [f"{label}: no samples"]
    on_stack: Counter[str] = Counter()
    for stack in stacks:
        on_stack.update(set(stack))
    innermost = Counter(stack[0] for stack in stacks if stack)
    n = len(stacks)
    lines = [f"{label}: {n} samples"]
    inner = [(k, v) for k, v in on_stack.most_common() if v < ENCLOSING * n][:top]
    lines += [f"  {100 * v / n:5.1f}%  {k}" for k, v in inner]
    lines += [f"  {100 * v / n:5.1f}%  {k}  (innermost)" for k, v in innermost.most_common(3)]
    return lines


def profile_text(
    samples: list[tuple[float, str, tuple[str, ...]]],
    events: list[list],
    started: float,
    least: float = 0.1,
) -> str:
    """The sampled stacks of each window of ``events`` (``[start, end, thread, what]`` in
    seconds from ``started``, compile-worker jobs left out) that lasted ``least`` seconds
    or more, and of the main thread before the first stage and after the last one."""
    staged = [e for e in events if e[2] != "compile worker"]
    first = min((e[0] for e in staged), default=0.0)
    last = max((e[1] for e in staged), default=0.0)
    ended = max((t - started for t, _, _ in samples), default=last)

    def stacks(thread: str, start: float, end: float) -> list[tuple[str, ...]]:
        return [s for t, name, s in samples if name == thread and start <= t - started <= end]

    def main_thread(label: str, start: float, end: float) -> list[str]:
        """The main thread's window, then that of threads Python did not start (autograd
        runs a CUDA backward on its device thread while the main one waits)."""
        lines = window_text(label, stacks("MainThread", start, end))
        if unnamed := stacks(UNNAMED, start, end):
            lines += window_text(f"{label}, threads Python did not start", unnamed)
        return lines

    lines = main_thread(f"   0.000 {first:8.3f}  MainThread  before the first stage", 0.0, first)
    for start, end, thread, what in staged:
        if end - start >= least:
            label = f"{start:8.3f} {end:8.3f}  {thread}  {what}"
            if thread == "MainThread":
                lines += main_thread(label, start, end)
            else:
                lines += window_text(label, stacks(thread, start, end))
    lines += main_thread(f"{last:8.3f} {ended:8.3f}  MainThread  after the last stage", last, ended)
    return "\n".join(lines)
