"""The errors kiln-autograd raises for programs it does not support."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
from torch.fx.experimental.symbolic_shapes import (
    GuardOnDataDependentSymNode,
    PendingUnbackedSymbolNotFound,
)


class UnsupportedError(NotImplementedError):
    """A construct of the graph that kiln-autograd cannot compile, named in the message.

    The message says what the graph did and what to do instead; nothing is compiled
    silently wrong.
    """


# FunctionalTensorMode's message for an op with an ordered side effect.
_EFFECT_ERROR = re.compile(r"token for effect .* came from the function (\S+)")


@contextlib.contextmanager
def explain_unsupported() -> Iterator[None]:
    """Turn tracing's errors for constructs kiln-autograd cannot graph into ones that say so."""
    try:
        yield
    except (GuardOnDataDependentSymNode, PendingUnbackedSymbolNotFound) as error:
        raise UnsupportedError(
            "the graph branches on, or sizes a tensor by, a value computed from a tensor's "
            f"contents ({str(error).splitlines()[0]}); a graph cannot hold that: compute it "
            "outside the graph (capture breaks the graph there)"
        ) from error
    except (DataDependentOutputException, DynamicOutputShapeException) as error:
        raise UnsupportedError(
            f"the graph calls {error.func}, whose output depends on a tensor's contents "
            "(a Python number as from .item(), or a shape as from nonzero or a boolean mask); "
            "call it outside the graph"
        ) from error
    except AssertionError as error:
        effect = _EFFECT_ERROR.search(str(error))
        if effect is None:
            raise
        raise UnsupportedError(
            f"the graph calls {effect.group(1)}, an op with a side effect that a functional "
            "graph cannot order (torch.linalg's error checks are one); run that part "
            "eagerly, outside the graph"
        ) from error


class NeedsTrace(RuntimeError):
    """Raised by a compiler given a graph rebuilt from a cached record
    (:func:`~kiln_autograd.is_restored`) that it cannot serve from its own cache: the
    signature is then traced, and the compiler is given the traced graphs."""
