"""A training step's backward graph compiled in a thread while its forward compiles.

kiln-autograd knows a training signature's backward graph once it has partitioned the
joint graph, before it compiles the forward; compiled at the first backward, its whole
compile came after the forward's, and after the forward ran. :class:`Ahead` is the hook
kiln-autograd calls there (``aot(backward_ahead=...)``): it starts the backward's compile
in a thread of its own, and the two compiles take turns on
:mod:`kiln_loopir.compile_lock`, so that what one spends waiting (compile workers, a C++
compiler) the other spends working. The backward takes the first turn: its kernels are
the most and the slowest to build, so their build overlaps the forward's lowering, and
the forward's shorter build is what is left at the end. The frame's capture waits for
every compile it started before it returns (:meth:`Ahead.close`): no compile works while
the program runs, so none of them launches, times or captures on the device beside it.
The first backward takes the compiled graph, or raises what its compile raised, as it
would have compiled it there.

The thread runs as the backward would: the caller's context variables and CUDA device,
gradients off; its warnings point at the user's line that called. Which graphs compile
ahead is the ``backward_ahead`` option's (by default, those of a module called in training
mode, whose backward follows as a rule); a signature compiled at a call (a new grad mode,
say) compiles its backward at the first backward, as before.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.fx

from kiln_capture.user_frames import pointing_at, user_location
from kiln_loopir import compile_lock


class BackgroundCompile:
    """``compiler(gm, example_inputs)`` running in a daemon thread from construction on,
    taking its turns on the compile lock."""

    def __init__(self, compiler: Callable, gm: torch.fx.GraphModule, example_inputs: list):
        self._done = threading.Event()
        self.handed_over = threading.Event()  # it let the compile lock go: waiting, or done
        self._compiled: Callable | None = None
        self._error: BaseException | None = None
        context = contextvars.copy_context()
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        caller = user_location()  # where its warnings point: the call that compiles

        def compile_graph() -> None:
            try:
                if device is not None:
                    torch.cuda.set_device(device)
                with torch.no_grad(), compile_lock.compiling(self.handed_over), pointing_at(caller):
                    self._compiled = context.run(compiler, gm, example_inputs)
            except BaseException as exc:  # noqa: BLE001 - raised again by result()
                self._error = exc
            finally:
                self.handed_over.set()
                self._done.set()

        threading.Thread(target=compile_graph, name="kiln backward compile", daemon=True).start()

    def wait(self) -> None:
        self._done.wait()

    def result(self) -> Callable:
        """The compiled graph, once compiled (raises what the compile raised)."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._compiled  # type: ignore[return-value]


class Ahead:
    """kiln-autograd's ``backward_ahead`` hook for one capture's trace: it starts compiles
    until :meth:`close`, which waits for them. ``waiting()`` wraps the time this thread
    waits for a compile's first turn (the frame's: charged to no stage)."""

    def __init__(self, waiting: Callable[[], AbstractContextManager] = nullcontext) -> None:
        self.open = True
        self.started: list[BackgroundCompile] = []
        self.waiting = waiting

    def __call__(self, compiler: Callable, gm: torch.fx.GraphModule, example_inputs: list):
        if not self.open:  # a signature compiled at a call: its first backward compiles it
            return None
        pending = BackgroundCompile(compiler, gm, example_inputs)
        self.started.append(pending)
        with self.waiting():  # its build overlaps the forward's work
            compile_lock.first_turn(pending.handed_over)
        return pending.result

    def close(self) -> None:
        """Start no more compiles (a later one comes at its first backward) and wait for
        those started (their errors are the first backward's)."""
        self.open = False
        for pending in self.started:
            pending.wait()
        self.started.clear()
