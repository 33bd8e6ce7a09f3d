"""Scans (cumulative sums, products, maxima, log-sum-exp, arg-max/min) as Triton source: the
part of :class:`kiln_triton.render.KernelRenderer` that renders a kernel's one scan, over
rows held whole or walked in chunks with a running value carried between them."""

from __future__ import annotations

from collections.abc import Callable

from kiln_triton.dtypes import compute_type
from kiln_triton.errors import TritonCodegenError
from kiln_triton.literals import identity
from kiln_triton.values import Value


class ScanRendering:
    """Mixed into the kernel renderer, whose reduction head and straight body it uses."""

    def _scan_of_block(self, v: Value) -> tuple[list[str], Callable[[str, str], str]]:
        """Lines scanning value ``v``'s block along its rows, and ``after(a, a_index)``: the
        expression that combines a running value (its position, for argmax/argmin) before
        the block with the block's scan."""
        kind, i, n = v.attrs["type"], v.args[0].name, v.name
        values = f"tl.broadcast_to({i}, [XBLOCK, RBLOCK])"
        if kind in ("argmax", "argmin"):
            fn = f"kt.cum{kind[3:]}_combine"
            idx = "tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)"
            scan = f"{n}_v, {n} = tl.associative_scan(({values}, {idx}), 1, {fn})"
            return [scan], lambda a, a_index: f"{fn}({a}, {a_index}, {n}_v, {n})"
        if kind == "sum":
            return [f"{n} = tl.cumsum({values}, 1)"], lambda a, _: f"{a} + {n}"
        if kind == "prod":
            return [f"{n} = tl.cumprod({values}, 1)"], lambda a, _: f"{a} * {n}"
        if kind in ("max", "min"):
            fn = f"kt.{kind}_combine"
        elif kind == "logsumexp":
            fn = "kt.log_add_exp_combine"
        else:
            raise TritonCodegenError(f"kiln-triton does not render scan {kind!r} yet")
        return [f"{n} = tl.associative_scan({values}, 1, {fn})"], lambda a, _: f"{fn}({a}, {n})"

    def persistent_scan(self, v: Value) -> list[str]:
        """A scan over rows held whole (``RBLOCK`` covers them); lanes past the row's end
        come after its elements and change none of them."""
        lines, _ = self._scan_of_block(v)
        return lines + self._round(v)

    def scan_function(self, suffix: str) -> list[str]:
        """The persistent or looped variant of a kernel with a scan (its one node). The
        looped one walks the rows in chunks of ``RBLOCK``: each chunk's scan is combined
        with the running value the chunk before left at its last element (the
        identity before the first)."""
        head, body = self._reduction_head(suffix)
        if suffix == "persistent":
            body += ["rindex = rbase"] + self._rdefs()
            body += self._straight_body(scan_lines=self.persistent_scan)
            return head + ["    " + line for line in body]
        (v,) = [x for x in self.rec.values if x.op == "scan"]
        kind, src, n = v.attrs["type"], v.attrs["src"], v.name
        arg = kind in ("argmax", "argmin")
        ident = identity(kind, src)
        body.append(f"{n}_carry = tl.full([XBLOCK, 1], {ident}, {compute_type(src)})")
        if arg:
            body.append(f"{n}_carry_index = tl.zeros([XBLOCK, 1], tl.int64)")
        last = "rindex == tl.minimum(roffset + RBLOCK, rnumel) - 1"

        def scan_lines(v: Value) -> list[str]:
            lines, after = self._scan_of_block(v)
            running = after(f"{n}_carry", f"{n}_carry_index")
            lines.append(f"{n}_v, {n} = {running}" if arg else f"{n} = {running}")
            value = f"{n}_v" if arg else n
            lines.append(f"{n}_carry = tl.sum(tl.where({last}, {value}, 0), 1, keep_dims=True)")
            if arg:
                lines.append(
                    f"{n}_carry_index = tl.sum(tl.where({last}, {n}, 0), 1, keep_dims=True)"
                )
            return lines + self._round(v)

        inner = ["rindex = roffset + rbase"] + self._rdefs()
        inner += self._straight_body(scan_lines=scan_lines)
        body += ["for roffset in range(0, rnumel, RBLOCK):"] + ["    " + x for x in inner]
        return head + ["    " + line for line in body]
