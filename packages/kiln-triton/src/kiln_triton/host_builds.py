"""Native host programs built while the graph already runs.

A graph's native host program is C++ that kiln-cpp's compiler turns into a library: about
a second for a large graph's backward at ``-O0``. Its first calls do not need it: until
the library is built, the program hands each call to the Python host program (its
fallback), which launches the same kernels. So where the cache lacks the library,
:func:`load` returns a program whose library is built meanwhile and that runs it from
the call after the build; the compile does not wait for the C++ compiler.

The build runs on kiln-cpp's pool of build threads (``build.build_async``), which a
process that ends finishes first, so that the next process finds the library in the
cache. ``$KILN_TRITON_HOST_BUILD=wait`` builds before the compile returns instead;
:func:`wait_for_host_builds` waits for the builds in flight (tests, and callers that time
the native program).
"""

from __future__ import annotations

import functools
import logging
import os
import threading

from kiln_loopir import compile_lock

log = logging.getLogger("kiln.triton")
_builds = {"in flight": 0}  # programs whose library is being built, until started (or failed)
_changed = threading.Condition()


def in_background() -> bool:
    return os.environ.get("KILN_TRITON_HOST_BUILD", "background") != "wait"


def load(host, wait: bool = False):
    """``host`` with its ``program``: its library loaded from the cache, else built now
    (``wait``, or ``$KILN_TRITON_HOST_BUILD=wait``), else built in a thread while the
    program runs its fallback."""
    from kiln_cpp import build
    from kiln_cpp.codegen import HOST_HEADER, load_program, pending_program

    source = HOST_HEADER + host.source
    path = build.lookup([], host=source, host_flags=build.LAUNCH_HOST_FLAGS)
    if path is None and not wait and in_background():
        host.program = pending_program(host)
        _start(host, source)
        return host
    if path is None:
        with compile_lock.waiting():  # another graph's compile may work meanwhile
            path, _ = build.build([], host=source, host_flags=build.LAUNCH_HOST_FLAGS)
    host.program = load_program(build.load(path), host)
    return host


def wait_for_host_builds() -> None:
    """Return once every host program built in the background runs its library (or its
    build failed: that program keeps running the Python one)."""
    with _changed:
        _changed.wait_for(lambda: _builds["in flight"] == 0)


def _start(host, source: str) -> None:
    from kiln_cpp import build

    with _changed:
        _builds["in flight"] += 1
    future = build.build_async([], host=source, host_flags=build.LAUNCH_HOST_FLAGS)
    future.add_done_callback(functools.partial(_built, host))


def _built(host, future) -> None:
    """``host``'s program runs its library from now on (run where the build finished)."""
    from kiln_cpp import build
    from kiln_cpp.codegen import start_program

    try:
        path, _ = future.result()
        start_program(host.program, build.load(path), host)
        log.info("host program: native library built (%s)", path.parent.name)
    except Exception as exc:  # noqa: BLE001 - the Python host program keeps running it
        log.warning("host program: Python, building the native one failed (%s)", exc)
    finally:
        with _changed:
            _builds["in flight"] -= 1
            _changed.notify_all()
