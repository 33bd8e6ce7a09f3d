"""The errors kiln-autograd raises for programs it does not support."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator


class UnsupportedError(NotImplementedError):
    """A construct of the graph that kiln-autograd cannot compile, named in the message.

    The message says what the graph did and what to do instead; nothing is compiled
    silently wrong.
    """


# FunctionalTensorMode's message for an op with an ordered side effect.
_EFFECT_ERROR = re.compile(r"token for effect .* came from the function (\S+)")


@contextlib.contextmanager
def explain_side_effects() -> Iterator[None]:
    """Turn functionalization's error for an op with a side effect into one that names it."""
    try:
        yield
    except AssertionError as error:
        effect = _EFFECT_ERROR.search(str(error))
        if effect is None:
            raise
        raise UnsupportedError(
            f"the graph calls {effect.group(1)}, an op with a side effect that a functional "
            "graph cannot order (torch.linalg's error checks are one); run that part "
            "eagerly, outside the graph"
        ) from error
