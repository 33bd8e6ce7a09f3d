"""The native tensor matcher of kiln-capture's guards: kiln-cpp's host runtime checks every
parameter and buffer of a guard in one C++ call (``TensorsMatch``), with exactly the checks
of kiln-capture's Python reference (type, size, stride, dtype, device, requires_grad,
dispatch keys). Registered as ``native``, tried first; where the runtime cannot be built
(no C++ compiler) the Python reference runs."""

from __future__ import annotations

import logging

import torch

from kiln_capture.tensor_match import TensorMatcher, TensorSpec, register_matcher

log = logging.getLogger("kiln.guards")


def native_matcher(specs: list[TensorSpec], examples: list[torch.Tensor]) -> TensorMatcher | None:
    try:
        from kiln_cpp.host import load_runtime

        runtime = load_runtime()
    except Exception as exc:  # noqa: BLE001 - no compiler or headers: the reference runs
        log.info("tensor guards in Python: kiln-cpp's host runtime is unavailable (%s)", exc)
        return None
    if any(e.layout is not torch.strided for e in examples):
        return None
    check = runtime.TensorsMatch(
        [
            (s.type, s.dtype, s.device_index, s.shape, s.stride, s.requires_grad, s.keys)
            for s in specs
        ]
    )
    if not check(*examples):  # never the case for unchanged tensors; if so, the reference
        return None
    lines = [f"# tensors_match: kiln-cpp's TensorsMatch over {len(specs)} tensors, each as"]
    for i, spec in enumerate(specs):
        lines.append(f"#   t{i} ({spec.expr}): {', '.join(spec.checks(f't{i}', _label))}")
    return TensorMatcher(check, "native", "\n".join(lines) + "\n")


def _label(prefix: str, value) -> str:
    return str(value).replace("torch.", "") if prefix == "dtype" else value.__name__


register_matcher("native", native_matcher)
