"""Kiln's demo: build a Hugging Face model from a small config and show what Kiln does with it.

Run it with ``python3 -m nox -s demo``.
"""

from __future__ import annotations

import time

import torch
from models import tiny_bert

import kiln


def main() -> None:
    print(f"kiln {kiln.__version__}, torch {torch.__version__}")
    print("installed plug-ins:")
    for plugin in kiln.list_backends():
        print(f"  {plugin.describe()}")

    torch.manual_seed(0)
    model, inputs = tiny_bert()
    with torch.no_grad():
        start = time.perf_counter()
        out = model(**inputs)
        eager_ms = (time.perf_counter() - start) * 1e3
    print(
        f"BERT (2 layers, hidden 64) eager: last_hidden_state {tuple(out.last_hidden_state.shape)}"
        f" in {eager_ms:.1f} ms"
    )
    print("kiln.compile is not available in this release, so nothing was compiled.")


if __name__ == "__main__":
    main()
