"""Kiln's demo: a Hugging Face BERT, built from a small config, compiled by Kiln on the CPU.

Run it with ``python3 -m nox -s demo`` (or ``python3 integration/demo.py`` where Kiln and
transformers are installed). It

1. builds BERT for masked language modelling (2 layers, hidden 64, random weights);
2. compiles it with ``kiln.compile`` — capture, autograd, loop IR, C++ kernels — and
   checks inference and one training step (loss, every gradient, the parameters after an
   SGD step) against eager;
3. measures the compile time with empty caches, then again in a second process that finds
   Kiln's on-disk cache;
4. measures time per call against eager and ``torch.compile`` (inductor), in this run;
5. says where the debug dump (every stage of every compiled frame) went.

Caches live in a fresh temporary folder, so every run starts cold.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import torch
from models import demo_bert

import kiln

SEED = 0
TOL = {"rtol": 1e-4, "atol": 1e-5}
GRAD_TOL = {"rtol": 1e-3, "atol": 1e-5}


def build():
    torch.manual_seed(SEED)
    return demo_bert()


def train_step(model, inputs, optimizer) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    optimizer.step()
    return loss.detach()


def first_calls(compiled, inputs) -> dict[str, float]:
    """Seconds of the first inference call and the first training step (compile included)."""
    compiled.eval()
    start = time.perf_counter()
    with torch.no_grad():
        compiled(**inputs)
    inference = time.perf_counter() - start
    compiled.train()
    optimizer = torch.optim.SGD(compiled.parameters(), lr=0.1)
    start = time.perf_counter()
    train_step(compiled, inputs, optimizer)
    return {"inference": inference, "training": time.perf_counter() - start}


def cached_compile_in_a_second_process(env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--first-calls"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the second process failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_inference(compiled, reference, inputs) -> None:
    compiled.eval()
    reference.eval()
    with torch.no_grad():
        out, expected = compiled(**inputs), reference(**inputs)
    torch.testing.assert_close(out.logits, expected.logits, **TOL)


def check_training_step(compiled, model, reference, inputs) -> None:
    compiled.train()
    reference.train()
    loss = train_step(compiled, inputs, torch.optim.SGD(compiled.parameters(), lr=0.1))
    loss_ref = train_step(reference, inputs, torch.optim.SGD(reference.parameters(), lr=0.1))
    torch.testing.assert_close(loss, loss_ref, **TOL)
    params, params_ref = dict(model.named_parameters()), dict(reference.named_parameters())
    with_grad = {n for n, p in params.items() if p.grad is not None}
    assert with_grad == {n for n, p in params_ref.items() if p.grad is not None}
    for name in with_grad:
        torch.testing.assert_close(params[name].grad, params_ref[name].grad, **GRAD_TOL)
        torch.testing.assert_close(params[name], params_ref[name], **GRAD_TOL)


def time_per_call(fns: dict[str, object], run, rounds: int = 7, calls: int = 10):
    """Best time per call of each function, in interleaved rounds."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                run(fn)
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return best


def main() -> None:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kiln-demo-"))
    caches = {
        "KILN_CACHE_DIR": str(workdir / "kiln-cache"),
        "KILN_CPP_CACHE_DIR": str(workdir / "kiln-cpp-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor-cache"),
    }
    os.environ.update(caches)
    debug_dir = workdir / "debug"
    torch.set_num_threads(os.cpu_count() or 1)

    print(f"kiln {kiln.__version__}, torch {torch.__version__}, {os.cpu_count()} CPU cores")
    for plugin in kiln.list_backends():
        print(f"  plug-in {plugin.describe()}")
    model, inputs = build()
    reference = copy.deepcopy(model)
    n_params = sum(p.numel() for p in model.parameters())
    batch, length = inputs["input_ids"].shape
    print(
        f"\nBERT for masked LM: 2 layers, hidden 64, {n_params / 1e3:.0f}k parameters, "
        f"batch {batch} x {length} tokens"
    )

    # 1. compile with empty caches; check inference and a training step against eager
    compiled = kiln.compile(model, options={"debug_dir": str(debug_dir)})
    cold = first_calls(compiled, inputs)
    model.zero_grad(set_to_none=True)
    reference.load_state_dict(model.state_dict())
    check_inference(compiled, reference, inputs)
    check_training_step(compiled, model, reference, inputs)
    print("inference and a training step equal eager (logits, loss, every gradient): yes")
    stages = kiln.compile_times()

    # 2. the same compile in a second process, which finds the on-disk cache
    cached = cached_compile_in_a_second_process({**os.environ, **caches})

    # 3. torch.compile (inductor) in this process, from empty caches
    inductor_model = copy.deepcopy(model)
    inductor = torch.compile(inductor_model)
    inductor_cold = first_calls(inductor, inputs)

    # 4. time per call, interleaved
    eager_model = copy.deepcopy(model)
    for m in (compiled, eager_model, inductor):
        m.eval()
    with torch.no_grad():
        infer = time_per_call(
            {"eager": eager_model, "kiln": compiled, "torch.compile": inductor},
            lambda m: m(**inputs),
        )
    for m in (compiled, eager_model, inductor):
        m.train()
    optimizers = {
        m: torch.optim.SGD(m.parameters(), lr=1e-3) for m in (compiled, eager_model, inductor)
    }
    train = time_per_call(
        {"eager": eager_model, "kiln": compiled, "torch.compile": inductor},
        lambda m: train_step(m, inputs, optimizers[m]),
        rounds=5,
        calls=5,
    )

    print()
    rows = [
        ("", "eager", "kiln", "torch.compile"),
        ("compile, empty caches", "", "", ""),
        ("  inference", "-", f"{cold['inference']:.1f} s", f"{inductor_cold['inference']:.1f} s"),
        ("  training step", "-", f"{cold['training']:.1f} s", f"{inductor_cold['training']:.1f} s"),
        ("compile, 2nd process", "", "", ""),
        ("  inference", "-", f"{cached['inference']:.1f} s", "not measured"),
        ("  training step", "-", f"{cached['training']:.1f} s", "not measured"),
        ("time per call", "", "", ""),
        *(
            (
                f"  {what}",
                f"{times['eager'] * 1e3:.2f} ms",
                f"{times['kiln'] * 1e3:.2f} ms",
                f"{times['torch.compile'] * 1e3:.2f} ms",
            )
            for what, times in (("inference", infer), ("training step", train))
        ),
        ("speedup over eager", "", "", ""),
        *(
            (
                f"  {what}",
                "1.00x",
                f"{times['eager'] / times['kiln']:.2f}x",
                f"{times['eager'] / times['torch.compile']:.2f}x",
            )
            for what, times in (("inference", infer), ("training step", train))
        ),
        ("kiln over torch.compile", "", "", ""),
        *(
            (f"  {what}", "", f"{times['torch.compile'] / times['kiln']:.2f}x", "")
            for what, times in (("inference", infer), ("training step", train))
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )

    total = sum(stages.values())
    where = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(stages.items(), key=lambda kv: -kv[1]))
    print(f"\nkiln's compile stages in the first process ({total:.1f} s in all): {where}")
    print(dump_summary(debug_dir))
    print(
        f"kiln's cache for this run: {caches['KILN_CACHE_DIR']} (yours is ~/.cache/kiln: "
        "python -m kiln cache info shows it, python -m kiln cache clear empties it)"
    )


def dump_summary(debug_dir: pathlib.Path) -> str:
    """Where the debug dump went, and the files of every frame in it."""
    frames = sorted(p for p in debug_dir.iterdir() if p.is_dir())
    count = f"{len(frames)} frame" + ("" if len(frames) == 1 else "s")
    lines = [f"debug dump: {debug_dir}  ({count})"]
    for frame in frames:
        files = sorted(p.name for p in frame.iterdir())
        lines.append(f"  {frame.name}: {', '.join(files)}")
    return "\n".join(lines)


def first_calls_main() -> None:
    """The second process: the same model and compile, its first calls timed."""
    model, inputs = build()
    print(json.dumps(first_calls(kiln.compile(model), inputs)))


if __name__ == "__main__":
    if "--first-calls" in sys.argv:
        first_calls_main()
    else:
        main()
