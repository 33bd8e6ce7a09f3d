"""Split reductions: a reduction with few outputs over many elements (a column sum, the sum
of a whole tensor) as two launches, so that it fills the GPU.

``<name>_split`` (``kiln_sum_split`` for a kernel named ``kiln_sum_2``) runs ``NSPLIT``
programs per block of outputs; each reduces one chunk of the reduction (``rsplit``
elements) and writes its partial results (in float32) to a workspace,
``[part, split, output]``. ``<name>_split_finish`` then combines each output's
partials in a fixed order, so the result does not depend on which program finished first,
and computes what the kernel does after the reduction. Kernels qualify with one
reduction loop, no stores inside it, and float sums, maxima, minima or Welford
statistics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln_triton.render import KernelRenderer

SPLIT_KINDS = ("sum", "max", "min", "welford")
WELFORD_PARTS = ("mean", "m2", "n")


def split_parts(r: KernelRenderer) -> list[tuple[str, str]]:
    """``(name, part)`` for each partial result the workspace holds (empty when the kernel
    does not qualify). ``name`` is the reduction's value, or ``wf_<input>`` for Welford."""
    plan = r.loop_plan()
    if plan.nloops != 1 or any(p % 2 for p in plan.store_pos):
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


def _workspace_index(part: int, split: str) -> str:
    return f"ws_ptr + ({part} * nsplit + {split}) * xnumel + xindex"


def split_function(r: KernelRenderer, parts: list[tuple[str, str]]) -> list[str]:
    """The first launch: partial reductions over one chunk each."""
    head, body = r._reduction_head("split", split=True)
    plan = r.loop_plan()
    body += [line for line in r.segment(plan, 0, {}) if not line.startswith("tl.store(")]
    finals: dict[str, list[str]] = {}
    loop = r._loop(1, r.rec.values, r.rec.stores, plan.store_pos, plan.loop, plan.need, {}, finals)
    chunk = "range(split * rsplit, tl.minimum(split * rsplit + rsplit, rnumel), RBLOCK)"
    body += [f"for roffset in {chunk}:" if x.startswith("for roffset") else x for x in loop]
    for lines in finals.values():
        body.append(lines[0])  # the block's reduction, before rounding to the result's type
    for i, (name, part) in enumerate(parts):
        value = f"{name}_{part}" if name.startswith("wf_") else name
        body.append(f"tl.store({_workspace_index(i, 'split')}, {value}, xmask)")
    return head + ["    " + line for line in body]


def finish_function(r: KernelRenderer, parts: list[tuple[str, str]]) -> list[str]:
    """The second launch: each output's partials combined, then the rest of the kernel."""
    head, body = r._reduction_head("split_finish", finish=True)
    body += ["sindex = tl.arange(0, SPLIT_BLOCK)[None, :]", "smask = sindex < nsplit"]
    plan = r.loop_plan()
    body += r.segment(plan, 0, {})
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
    body += r.segment(plan, 1, finals)
    return head + ["    " + line for line in body]
