"""Opcode handlers, one module per family; importing this package fills the handler table."""

from kiln_capture.opcodes import (  # noqa: F401
    build,
    calls,
    control,
    exceptions,
    load_store,
    operators,
)
