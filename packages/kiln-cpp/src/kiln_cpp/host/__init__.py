"""The compiled host program of a CPU graph: C++ rendered from the schedule
(:mod:`kiln_cpp.host.render`), built into the graph's library beside its kernels and run
through the host runtime (:mod:`kiln_cpp.host.runtime`)."""

from kiln_cpp.host.externs import HostNotRendered
from kiln_cpp.host.render import NativeHost, render_host
from kiln_cpp.host.runtime import load_runtime, start_loading

__all__ = ["HostNotRendered", "NativeHost", "load_runtime", "render_host", "start_loading"]
