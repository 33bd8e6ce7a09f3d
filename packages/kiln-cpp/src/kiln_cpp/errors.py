"""The errors kiln-cpp raises. Both derive from ``CppError`` (a ``RuntimeError``): a caller
that catches it can run the graph eagerly instead, and should say so in a warning."""


class CppError(RuntimeError):
    """Base class of kiln-cpp's errors."""


class CppCodegenError(CppError, NotImplementedError):
    """A kernel uses something the C++ generator does not render yet (named in the message)."""


class CppCompileError(CppError):
    """The C++ compiler is missing, or it failed on a generated source (its output is in
    the message)."""
