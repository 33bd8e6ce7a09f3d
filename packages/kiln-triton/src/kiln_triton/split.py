"""Split reductions: a reduction with few outputs over many elements (a column sum, the sum
of a whole tensor) as two launches, so that it fills the GPU.

``<name>_split`` (``kiln_sum_split`` for a kernel named ``kiln_sum_2``) runs ``NSPLIT``
programs per block of outputs; each reduces one chunk of the reduction (``rsplit``
elements) and writes its partial results (in float32) to a workspace,
``[part, split, output]``. ``<name>_split_finish`` then combines each output's
partials in a fixed order, so the result does not depend on which program finished first,
and computes what the kernel does after the reduction. Kernels qualify with one
reduction loop and float sums, maxima, minima or Welford statistics. Elementwise results
stored inside the reduction loop (a ReLU's output, whose mean a squeeze-and-excite block
takes) are stored by the program whose chunk computes them, where the kernel reads them
back only at the element it stores.

A kernel may also have a second loop after the reduction that stores elementwise results
(a batch norm in training: per-channel statistics over the batch and the image, then the
normalized tensor). Its finish runs as many programs as the first launch: each combines
its output block's partials (every program the same, in the same order) and walks its own
chunk of the second loop. The per-output results the kernel stores after the reduction
(the statistics, a running average) are stored by the programs of the first chunk alone.
Such a kernel qualifies when its second loop computes nothing from a buffer stored per
output (a running average read after its update) and reads each buffer it stores only
where it stores it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

if TYPE_CHECKING:
    from kiln_triton.render import KernelRenderer

SPLIT_KINDS = ("sum", "max", "min", "welford")
CHUNK = "range(split * rsplit, tl.minimum(split * rsplit + rsplit, rnumel), RBLOCK)"
FIRST_CHUNK = "first_chunk"  # the programs that store per-output results
WELFORD_PARTS = ("mean", "m2", "n")


def split_parts(r: KernelRenderer) -> list[tuple[str, str]]:
    """``(name, part)`` for each partial result the workspace holds (empty when the kernel
    does not qualify). ``name`` is the reduction's value, or ``wf_<input>`` for Welford."""
    if not _loops_qualify(r):
        return []
    parts: list[tuple[str, str]] = []
    for v in r.rec.values:
        if v.op != "reduction":
            continue
        kind = r._reduce_kind(v)
        if kind not in SPLIT_KINDS or not v.attrs["src"].is_floating_point:
            return []
        if kind == "welford":
            key = f"wf_{v.args[0].name}"
            if (key, "mean") not in parts:
                parts += [(key, p) for p in WELFORD_PARTS]
        else:
            parts.append((v.name, kind))
    return parts


def has_epilogue(r: KernelRenderer) -> bool:
    """Whether the kernel's loop plan has a second loop, after its reductions."""
    return r.loop_plan().nloops == 2


def _loops_qualify(r: KernelRenderer) -> bool:
    """One loop of reductions (its elementwise stores made by the chunk that computes them),
    then at most one loop of stores that chunks of programs can run apart (see the
    module's docstring)."""
    plan = r.loop_plan()
    if plan.nloops not in (1, 2):
        return False
    chunked = [st for st, p in zip(r.rec.stores, plan.store_pos, strict=True) if p % 2]
    if not all(_read_only_where_stored(r, st) for st in chunked):
        return False
    if plan.nloops == 1:
        return True
    reductions = [v for v in r.rec.values if v.op == "reduction"]
    if any(plan.position[v.name] != 2 for v in reductions):
        return False  # a reduction in the second loop
    epilogue = [st for st, p in zip(r.rec.stores, plan.store_pos, strict=True) if p == 3]
    stored_per_output = {
        st.buffer for st, p in zip(r.rec.stores, plan.store_pos, strict=True) if p % 2 == 0
    }
    tainted: set[str] = set()  # values computed from a buffer stored per output
    for v in r.rec.values:
        if (v.op == "load" and v.attrs["buffer"] in stored_per_output) or any(
            a.name in tainted for a in v.args
        ):
            tainted.add(v.name)
    return not any(v.name in tainted for st in epilogue for v in (st.value, *st.deps))


def _read_only_where_stored(r: KernelRenderer, st) -> bool:
    """Whether the kernel reads the buffer of store ``st`` (made inside a loop) only at the
    element the store writes: another chunk's program may not have stored the rest."""
    for v in r.rec.values:
        same = v.op == "load" and v.attrs["buffer"] == st.buffer
        if same and not (v.inner and sympy.expand(v.attrs["index"] - st.index) == 0):
            return False
    return True


def _workspace_index(part: int, split: str) -> str:
    return f"ws_ptr + ({part} * nsplit + {split}) * xnumel + xindex"


def split_function(r: KernelRenderer, parts: list[tuple[str, str]]) -> list[str]:
    """The first launch: partial reductions over one chunk each."""
    head, body = r._reduction_head("split", split=True)
    plan = r.loop_plan()
    body += [line for line in r.segment(plan, 0, {}) if not line.startswith("tl.store(")]
    finals: dict[str, list[str]] = {}
    body += r._loop(
        1, r.rec.values, r.rec.stores, plan.store_pos, plan.loop, plan.need, {}, finals, CHUNK
    )
    for lines in finals.values():
        body.append(lines[0])  # the block's reduction, before rounding to the result's type
    for i, (name, part) in enumerate(parts):
        value = f"{name}_{part}" if name.startswith("wf_") else name
        body.append(f"tl.store({_workspace_index(i, 'split')}, {value}, xmask)")
    return head + ["    " + line for line in body]


def finish_function(r: KernelRenderer, parts: list[tuple[str, str]]) -> list[str]:
    """The second launch: each output's partials combined, then the rest of the kernel
    (the second loop over this program's chunk, where there is one)."""
    head, body = r._reduction_head("split_finish", finish=True)
    body += ["sindex = tl.arange(0, SPLIT_BLOCK)[None, :]", "smask = sindex < nsplit"]
    # a block like the masks it joins (Triton's interpreter takes no scalar in a mask)
    body.append(f"{FIRST_CHUNK} = (split + tl.zeros([XBLOCK, 1], tl.int32)) == 0")
    plan = r.loop_plan()
    body += r.segment(plan, 0, {}, FIRST_CHUNK)
    loaded = {}
    for i, (name, part) in enumerate(parts):
        ident = {"max": 'float("-inf")', "min": 'float("inf")'}.get(part, "0")
        loaded[(name, part)] = f"ws_{i}"
        body.append(
            f"ws_{i} = tl.load({_workspace_index(i, 'sindex')}, xmask & smask, other={ident})"
        )
    finals: dict[str, list[str]] = {}
    combined: set[str] = set()  # Welford statistics shared by mean and m2
    for v in r.rec.values:
        if v.op != "reduction":
            continue
        kind = r._reduce_kind(v)
        if kind == "welford":
            key = f"wf_{v.args[0].name}"
            _, _, final_and_after = r.looped_reduction(v, {key: True})
            combine = []
            if key not in combined:
                combined.add(key)
                mean, m2, n = (loaded[(key, p)] for p in WELFORD_PARTS)
                combine = [
                    f"{key}_mean, {key}_m2, {key}_n = tl.reduce(({mean}, {m2}, {n}), 1, "
                    "kt.welford_combine, keep_dims=True)"
                ]
            finals[v.name] = combine + final_and_after[-1:]
            continue
        ws = loaded[(v.name, kind)]
        combine = {
            "sum": f"tl.sum({ws}, 1, keep_dims=True)",
            "max": f"tl.reduce({ws}, 1, kt.max_combine, keep_dims=True)",
            "min": f"tl.reduce({ws}, 1, kt.min_combine, keep_dims=True)",
        }[kind]
        finals[v.name] = [f"{v.name} = {combine}"] + r._round(v)
    body += r.segment(plan, 1, finals, FIRST_CHUNK)
    if has_epilogue(r):
        body += r._loop(
            2, r.rec.values, r.rec.stores, plan.store_pos, plan.loop, plan.need, {}, {}, CHUNK
        )
        body += r.segment(plan, 2, {}, FIRST_CHUNK)
    return head + ["    " + line for line in body]
