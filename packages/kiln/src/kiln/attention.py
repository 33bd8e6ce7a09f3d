"""Attention written out by hand, rewritten to the fused attention op, on a captured graph.

``softmax(q @ k.transpose(-2, -1) * scale + mask, dim=-1) @ v`` computes what
``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)`` computes, but as
two matrix products and a softmax that write the whole ``L × S`` score matrix to memory
and read it back; the fused op (flash, memory-efficient or cuDNN attention on CUDA) never
writes it. :func:`fused_attention` finds that chain in a captured graph, before
kiln-autograd traces it (so the backward is the fused op's own, and the trace routes it
to the kernel eager would pick: ``kiln_autograd``'s attention routing), and replaces it.

The chain is matched as the user wrote it: ``@``/``torch.matmul``; a scale by ``*`` or
``/`` with a number (none: a scale of 1); an optional ``+ mask`` whose dtype is the
queries' (an additive mask) or ``.masked_fill(m, -inf)`` with a boolean ``m`` (SDPA's
``attn_mask=~m``; another fill value is not SDPA's masking: a fully masked row would
differ); ``softmax`` over the last dimension (function or method); an optional dropout
of the probabilities (``dropout_p`` in training; the random numbers then differ from
eager's, as any two dropout draws do); 4-D floating queries, keys and values of one
dtype. Every intermediate result must be used by the next step alone (a model that
also returns its attention weights keeps its chain). By default only graphs on CUDA are
rewritten (``options={"fused_attention": True}``: on the CPU too; ``False``: never).
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from kiln.graph_edits import value

MATMUL = (operator.matmul, torch.matmul)
SOFTMAX = (torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax)
TRANSPOSE = (torch.transpose, torch.Tensor.transpose)
MASKED_FILL = (torch.masked_fill, torch.Tensor.masked_fill)
DROPOUT = (torch.dropout, torch.nn.functional.dropout)
_NEUTRAL = {("dtype", None), ("_stacklevel", 3), ("_stacklevel", 5)}  # F.softmax's defaults


def fused_attention(gm: torch.fx.GraphModule, on_cpu: bool = False) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` with each hand-written attention replaced by the fused op, or None
    where it has none that qualifies (on CUDA, or on any device with ``on_cpu``)."""
    if not any(_match(n, on_cpu) is not None for n in gm.graph.nodes):
        return None
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    new = torch.fx.GraphModule(gm, graph)
    for out in list(graph.nodes):
        found = _match(out, on_cpu)
        if found is None:
            continue
        q, k, v, mask, scale, dropout_p = found
        with graph.inserting_before(out):
            if isinstance(mask, tuple):  # masked_fill(where, -inf): attend where it is False
                mask = graph.call_function(torch.logical_not, (mask[1],))
            kwargs = {"attn_mask": mask, "dropout_p": dropout_p, "scale": scale}
            fused = graph.call_function(
                torch.nn.functional.scaled_dot_product_attention, (q, k, v), kwargs
            )
        fused.meta = dict(out.meta)
        out.replace_all_uses_with(fused)
        _erase_chain(graph, out)
    graph.lint()
    new.recompile()
    return new


def _match(out: torch.fx.Node, on_cpu: bool):
    """``(q, k, v, mask, scale, dropout_p)`` where ``out`` ends a hand-written attention,
    else None; a boolean mask ``m`` of ``masked_fill(m, -inf)`` comes as ``("not", m)``."""
    if not _calls(out, MATMUL) or len(out.args) != 2 or out.kwargs:
        return None
    probs, v = out.args
    probs, dropout_p = _dropped_out(probs)
    if probs is None or not _calls(probs, SOFTMAX) or not _last_dim_softmax(probs):
        return None
    if len(_live_users(probs)) != 1:
        return None
    scores = probs.args[0]
    mask = None
    if _calls(scores, (operator.add,)) and len(scores.users) == 1:
        scores, mask = scores.args
        if not isinstance(mask, torch.fx.Node) or not isinstance(scores, torch.fx.Node):
            return None
    elif _calls(scores, MASKED_FILL) and len(scores.users) == 1 and len(scores.args) == 3:
        scores, where, fill = scores.args
        if not isinstance(where, torch.fx.Node) or fill != float("-inf"):
            return None
        mask = ("not", where)
    scores, scale = _scaled(scores)
    if scores is None or not _calls(scores, MATMUL) or len(scores.users) != 1:
        return None
    q, k_t = scores.args
    k = _transposed(k_t)
    if k is None or not _qualify(q, k, v, mask, on_cpu):
        return None
    return q, k, v, mask, scale, dropout_p


def _dropped_out(node: object) -> tuple[torch.fx.Node | None, float]:
    """``(x, p)`` for ``dropout(x, p)`` in training, ``(x, 0.0)`` for ``x`` or a dropout
    outside training; ``(None, 0.0)`` for anything else."""
    if not isinstance(node, torch.fx.Node):
        return None, 0.0
    if not _calls(node, DROPOUT):
        return node, 0.0
    names = ("input", "p", "train" if node.target is torch.dropout else "training")
    bound = dict(zip(names, node.args, strict=False)) | node.kwargs
    p, training = bound.get("p", 0.5), bound.get("train", bound.get("training", True))
    if len(node.users) != 1 or bound.get("inplace") or not isinstance(p, (int, float)):
        return None, 0.0
    if not isinstance(training, bool):
        return None, 0.0
    return bound["input"], float(p) if training else 0.0


def _live_users(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``node``'s users but dropouts whose result nothing reads (capture keeps the call of
    a dropout outside training and reads its input instead)."""
    return [u for u in node.users if u.users or not _calls(u, DROPOUT)]


def _scaled(node: object) -> tuple[torch.fx.Node | None, float]:
    """``(x, c)`` for ``x * c`` or ``x / (1/c)`` (a number ``c``), ``(node, 1.0)`` else."""
    if not isinstance(node, torch.fx.Node):
        return None, 1.0
    if len(node.users) == 1 and _calls(node, (operator.mul, operator.truediv)):
        x, c = node.args
        if isinstance(x, torch.fx.Node) and isinstance(c, (int, float)) and c != 0:
            return x, float(c) if node.target is operator.mul else 1.0 / c
    return node, 1.0


def _transposed(node: object) -> torch.fx.Node | None:
    """``k`` where ``node`` is ``k.transpose(-2, -1)`` (either order, or as positive dims)
    used once, else None."""
    if not _calls(node, TRANSPOSE) or len(node.users) != 1 or len(node.args) != 3:
        return None
    k, a, b = node.args
    val = _val(k)
    if val is None or not isinstance(a, int) or not isinstance(b, int):
        return None
    dims = {a % val.dim(), b % val.dim()}
    return k if dims == {val.dim() - 2, val.dim() - 1} else None


def _qualify(q, k, v, mask, on_cpu: bool) -> bool:
    vals = [_val(x) for x in (q, k, v)]
    if any(x is None for x in vals):
        return False
    qv = vals[0]
    if not qv.is_floating_point() or any(x.dim() != 4 or x.dtype != qv.dtype for x in vals):
        return False
    if qv.device.type != "cuda" and not (on_cpu and qv.device.type == "cpu"):
        return False
    if mask is None:
        return True
    boolean = isinstance(mask, tuple)
    mv = _val(mask[1] if boolean else mask)
    dtype = torch.bool if boolean else qv.dtype
    return mv is not None and mv.dtype == dtype and mv.dim() <= 4


def _last_dim_softmax(node: torch.fx.Node) -> bool:
    args = list(node.args[1:]) + [node.kwargs[k] for k in ("dim",) if k in node.kwargs]
    extra = {k for k, v in node.kwargs.items() if k != "dim" and (k, v) not in _NEUTRAL}
    val = _val(node)
    if extra or len(args) != 1 or val is None or not isinstance(args[0], int):
        return False
    return args[0] % val.dim() == val.dim() - 1


def _calls(node: object, targets: tuple) -> bool:
    if not isinstance(node, torch.fx.Node):
        return False
    if node.op == "call_function":
        return node.target in targets
    if node.op == "call_method":
        return any(getattr(t, "__name__", None) == node.target for t in targets)
    return False


def _val(node: object) -> torch.Tensor | None:
    return value(node, "example_value")


def _erase_chain(graph: torch.fx.Graph, out: torch.fx.Node) -> None:
    """Erase ``out`` and the nodes before it that nothing else uses any more."""
    todo = [out]
    while todo:
        node = todo.pop()
        for dead in [u for u in node.users if not u.users and _calls(u, DROPOUT)]:
            graph.erase_node(dead)
        if node.users or node.op != "call_function" and node.op != "call_method":
            continue
        inputs = node.all_input_nodes
        graph.erase_node(node)
        todo += inputs
