"""Reductions as Triton source: the part of :class:`kiln_triton.render.KernelRenderer` that
renders a reduction value, held whole (``persistent``: the row in registers), walked in
chunks (``looped``: per-lane accumulators combined after the loop) or over no range at all.
A max (min) and an argmax (argmin) over the same values come out of one reduction."""

from __future__ import annotations

import torch

from kiln_triton.dtypes import LOW_PRECISION, compute_type, tl_type
from kiln_triton.errors import TritonCodegenError
from kiln_triton.literals import identity
from kiln_triton.values import Value


class ReductionRendering:
    """Mixed into the kernel renderer, whose value lines and masks it uses."""

    def _reduce_kind(self, v: Value) -> str:
        kind, src = v.attrs["type"], v.attrs["src"]
        if src == torch.bool:  # bool sums and products are any/all
            kind = {"sum": "any", "prod": "all", "max": "any", "min": "all"}.get(kind, kind)
        return "welford" if kind.startswith("welford") else kind

    def _paired_arg_reduction(self, v: Value) -> Value | None:
        """The argmax (argmin) over the same values as max (min) reduction ``v``: both
        come out of one ``(value, index)`` reduction."""
        pair = {"max": "argmax", "min": "argmin"}.get(self._reduce_kind(v))
        if pair is None or not v.attrs["src"].is_floating_point:
            return None
        for other in self.rec.values:
            if (
                other.op == "reduction"
                and other.args[0] is v.args[0]
                and self._reduce_kind(other) == pair
            ):
                return other
        return None

    def persistent_reduction(self, v: Value, done: dict) -> list[str]:
        kind, src = self._reduce_kind(v), v.attrs["src"]
        i = v.args[0].name
        ct = compute_type(src)
        ident = identity(kind, src)
        masked = f"tl.where(rxmask, {i}, {ident})"
        n = v.name
        if n in done:  # computed beside its paired max/min
            return [f"{n} = {done.pop(n)}.to(tl.int64)"]
        paired = self._paired_arg_reduction(v)
        if paired is not None:
            values = f"tl.broadcast_to({masked}, [XBLOCK, RBLOCK])"
            idx = "tl.broadcast_to(rindex, [XBLOCK, RBLOCK])"
            done[paired.name] = f"{n}_index"
            return [
                f"{n}, {n}_index = tl.reduce(({values}, {idx}), 1, kt.arg{kind}_combine, "
                "keep_dims=True)",
            ] + self._round(v)
        if kind == "welford":
            key = f"wf_{i}"
            if key not in done:
                done[key] = True
                lines = [
                    f"{key}_mean = tl.sum(tl.where(rxmask, {i}, 0), 1, keep_dims=True) / rnumel",
                    f"{key}_dev = tl.where(rxmask, {i} - {key}_mean, 0)",
                    f"{key}_m2 = tl.sum({key}_dev * {key}_dev, 1, keep_dims=True)",
                ]
            else:
                lines = []
            part = "mean" if v.attrs["type"] == "welford.mean" else "m2"
            return lines + [f"{n} = {key}_{part}.to({ct})"]
        if kind == "sum":
            line = f"{n} = tl.sum({masked}, 1, keep_dims=True)"
        elif kind == "prod":
            line = f"{n} = tl.reduce({masked}, 1, kt.prod_combine, keep_dims=True)"
        elif kind in ("max", "min"):
            if src.is_floating_point:
                line = f"{n} = tl.reduce({masked}, 1, kt.{kind}_combine, keep_dims=True)"
            else:
                line = f"{n} = tl.{kind}({masked}, 1, keep_dims=True)"
        elif kind in ("any", "all"):
            fn = "max" if kind == "any" else "min"
            flag = f"tl.where(rxmask, ({i} != 0).to(tl.int8), {ident})"
            line = f"{n} = tl.{fn}({flag}, 1, keep_dims=True) != 0"
        elif kind in ("argmax", "argmin"):
            values = f"tl.broadcast_to({masked}, [XBLOCK, RBLOCK])"
            if src == torch.bool:
                values = (
                    f"tl.broadcast_to(tl.where(rxmask, {i}.to(tl.int8), {ident}), [XBLOCK, RBLOCK])"
                )
            idx = "tl.broadcast_to(rindex, [XBLOCK, RBLOCK])"
            return [
                f"_, {n} = tl.reduce(({values}, {idx}), 1, kt.{kind}_combine, keep_dims=True)",
                f"{n} = {n}.to(tl.int64)",
            ]
        else:
            raise TritonCodegenError(f"kiln-triton does not render reduction {kind!r} yet")
        return [line] + self._round(v)

    def _round(self, v: Value) -> list[str]:
        if v.dtype in LOW_PRECISION:
            return [f"{v.name} = {v.name}.to({tl_type(v.dtype)}).to(tl.float32)"]
        return []

    def looped_reduction(self, v: Value, done: dict) -> tuple[list[str], list[str], list[str]]:
        """(lines before the loop, lines in it, lines after it) for reduction ``v``."""
        kind, src = self._reduce_kind(v), v.attrs["src"]
        i = v.args[0].name
        ct = compute_type(src)
        ident = identity(kind, src)
        n = v.name
        acc = f"acc_{n}"
        tile = "[XBLOCK, RBLOCK]"
        masked = f"tl.where(rxmask, {i}, {ident}).to({ct})"
        if kind == "welford":
            key = f"wf_{i}"
            part = "mean" if v.attrs["type"] == "welford.mean" else "m2"
            result = (
                f"tl.where({key}_n == 0, float('nan'), {key}_mean)"
                if part == "mean"
                else f"{key}_m2"
            )
            after = [f"{n} = ({result}).to({ct})"]
            if key in done:
                return [], [], after
            done[key] = True
            before = [f"{key}_{p} = tl.zeros({tile}, {ct})" for p in ("mean", "m2", "n")]
            update = [
                f"{key}_mean, {key}_m2, {key}_n = kt.welford_update("
                f"{key}_mean, {key}_m2, {key}_n, {i}, rxmask)"
            ]
            final = [
                f"{key}_mean, {key}_m2, {key}_n = tl.reduce(({key}_mean, {key}_m2, {key}_n), 1, "
                "kt.welford_combine, keep_dims=True)"
            ]
            return before, update, final + after
        if kind in ("argmax", "argmin"):
            vt = "tl.int8" if src == torch.bool else ct
            value = f"tl.where(rxmask, {i}.to({vt}), {ident}).to({vt})"
            before = [
                f"{acc} = tl.full({tile}, {ident}, {vt})",
                f"{acc}_i = tl.zeros({tile}, tl.int64)",
            ]
            update = [
                f"{acc}, {acc}_i = kt.{kind}_combine({acc}, {acc}_i, {value}, rindex.to(tl.int64))"
            ]
            after = [f"_, {n} = tl.reduce(({acc}, {acc}_i), 1, kt.{kind}_combine, keep_dims=True)"]
            return before, update, after
        if kind in ("any", "all"):
            fn = "maximum" if kind == "any" else "minimum"
            before = [f"{acc} = tl.full({tile}, {ident}, tl.int8)"]
            flag = f"tl.where(rxmask, ({i} != 0).to(tl.int8), {ident}).to(tl.int8)"
            update = [f"{acc} = tl.{fn}({acc}, {flag})"]
            red = "max" if kind == "any" else "min"
            return before, update, [f"{n} = tl.{red}({acc}, 1, keep_dims=True) != 0"]
        before = [f"{acc} = tl.full({tile}, {ident}, {ct})"]
        if kind == "sum":
            update = [f"{acc} = {acc} + {masked}"]
            final = f"tl.sum({acc}, 1, keep_dims=True)"
        elif kind == "prod":
            update = [f"{acc} = {acc} * {masked}"]
            final = f"tl.reduce({acc}, 1, kt.prod_combine, keep_dims=True)"
        elif kind in ("max", "min"):
            if src.is_floating_point:
                update = [
                    f"{acc} = kt.{'maximum' if kind == 'max' else 'minimum'}({acc}, {masked})"
                ]
                final = f"tl.reduce({acc}, 1, kt.{kind}_combine, keep_dims=True)"
            else:
                update = [
                    f"{acc} = tl.{'maximum' if kind == 'max' else 'minimum'}({acc}, {masked})"
                ]
                final = f"tl.{kind}({acc}, 1, keep_dims=True)"
        else:
            raise TritonCodegenError(f"kiln-triton does not render reduction {kind!r} yet")
        return before, update, [f"{n} = {final}"] + self._round(v)

    def single_point_reduction(self, v: Value, done: dict) -> list[str]:
        """A reduction over no ranges (a 0-d tensor's sum): over its one element."""
        kind, i = self._reduce_kind(v), v.args[0].name
        if kind in ("argmax", "argmin"):
            return [f"{v.name} = tl.full([], 0, tl.int64)"]
        if kind in ("any", "all"):
            return [f"{v.name} = {i} != 0"]
        if v.attrs["type"] == "welford.m2":
            return [f"{v.name} = {i} * 0"]
        return [f"{v.name} = {i}"]
