"""The errors kiln-autograd raises for programs it does not support."""

from __future__ import annotations


class UnsupportedError(NotImplementedError):
    """A construct of the graph that kiln-autograd cannot compile, named in the message.

    The message says what the graph did and what to do instead; nothing is compiled
    silently wrong.
    """
