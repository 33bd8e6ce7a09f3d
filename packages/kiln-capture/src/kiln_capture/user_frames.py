"""Where a warning points: the user's line that led to it, not Kiln's own code.

Kiln's warnings are raised deep in its packages, in generated dispatchers
(``<kiln dispatch f>``) and beneath torch's module call machinery; ``stacklevel`` counted
from the raising function would point at one of those. :func:`user_stacklevel` counts the
frames up to the first that belongs to none of them: the user's call.
"""

from __future__ import annotations

import sys

# top-level packages whose frames are never the user's
NOT_THE_USERS = frozenset(
    {"kiln", "kiln_capture", "kiln_autograd", "kiln_loopir", "kiln_cpp", "kiln_triton",
     "kiln_cudagraphs", "torch"}
)  # fmt: skip


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by the function calling this point at
    the first frame outside Kiln, torch and Kiln's generated code."""
    frame, level = sys._getframe(2), 2
    while frame is not None and (
        str(frame.f_globals.get("__name__", "")).split(".")[0] in NOT_THE_USERS
        or frame.f_code.co_filename.startswith("<kiln")  # a generated dispatcher
    ):
        frame, level = frame.f_back, level + 1
    return level
