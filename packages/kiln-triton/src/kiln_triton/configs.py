"""Launch configurations: the small set of block sizes, warps and stages worth trying for
a kernel at given sizes, chosen by heuristics (the first is the heuristic's pick)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# a reduction up to this size keeps whole rows in registers (the persistent variant);
# rows up to WIDE_PERSISTENT_MAX may too, one row per program, if timing says so
PERSISTENT_MAX = 4096
WIDE_PERSISTENT_MAX = 32768
# a reduction over at least SPLIT_MIN_RNUMEL elements that fewer than SPLIT_BELOW_PROGRAMS
# programs would run splits into chunks, for about SPLIT_PROGRAMS programs in all
SPLIT_MIN_RNUMEL = 8192
SPLIT_BELOW_PROGRAMS = 256
SPLIT_PROGRAMS = 1024
# a split reduction's finish combines an XBLOCK x SPLIT_BLOCK tile of partials at once: at
# most this many (64 x 1024 Welford partials took 14 s to compile, ResNet-50's batch norms)
SPLIT_FINISH_TILE = 8192
# a column reduction over fewer rows, but at least SPLIT_MIN_COLUMN_RNUMEL, that as few
# programs would run is split too where timing says so (MobileNetV3's squeeze-and-excite
# means over 28 x 28 images: 8 x 72 columns of 784 rows ran in 18-72 programs, 8.5 µs)
SPLIT_MIN_COLUMN_RNUMEL = 512
# a tiled kernel over a small space runs in at least this many programs where tiles down to
# 16x16 allow: Llama's rotary table (cos and sin of a 128x64 transposed read) ran as two
# 64x64 programs on two of the H100's 132 SMs, 14.6 us
TILED_MIN_PROGRAMS = 64
# candidates per kernel, in the heuristic's order: each one is compiled and timed when a
# graph compiles, so they are its compile time (``$KILN_TRITON_MAX_CONFIGS``)
MAX_CANDIDATES = int(os.environ.get("KILN_TRITON_MAX_CONFIGS", "4"))
# a persistent row reduction's: the heuristic's block and warps, then twice the warps, then
# twice the rows (see reduction_configs)
PERSISTENT_CANDIDATES = 3


@dataclass(frozen=True)
class Config:
    variant: str  # the function of the kernel module: the kernel's name, or _persistent/_looped
    blocks: tuple[tuple[str, int], ...]
    num_warps: int = 4
    num_stages: int = 1
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def as_dict(self) -> dict:
        return {
            "variant": self.variant,
            "blocks": dict(self.blocks),
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        return cls(d["variant"], tuple(d["blocks"].items()), d["num_warps"], d["num_stages"])


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _warps(elements: int, lo: int = 1, hi: int = 16) -> int:
    return max(lo, min(hi, elements // 256))


def _unique(configs: list[Config]) -> list[Config]:
    seen, out = set(), []
    for c in configs:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def pointwise_configs(name: str, xnumel: int) -> list[Config]:
    cap = next_pow2(xnumel)
    out = []
    for x, w in ((1024, 4), (2048, 8), (512, 4), (4096, 8)):
        xb = max(16, min(x, cap))
        out.append(Config(name, (("XBLOCK", xb),), max(1, min(w, xb // 128))))
    return _unique(out)


def tiled_configs(name: str, ynumel: int, xnumel: int) -> list[Config]:
    out = []
    for y, x, w in ((64, 64, 4), (32, 128, 4), (128, 32, 4), (32, 32, 2)):
        yb, xb = max(16, min(y, next_pow2(ynumel))), max(16, min(x, next_pow2(xnumel)))
        out.append(Config(name, (("YBLOCK", yb), ("XBLOCK", xb)), max(1, min(w, yb * xb // 256))))
    spread = spread_tile(name, ynumel, xnumel, dict(out[0].blocks))
    return _unique(([spread] if spread is not None else []) + out)


def spread_tile(name: str, ynumel: int, xnumel: int, first: dict) -> Config | None:
    """For a small space that the ``first`` tile splits into fewer than
    :data:`TILED_MIN_PROGRAMS` programs, a smaller tile (halved along its longer side, down
    to 16x16) that splits it into more; None where the first tile makes enough."""
    yb, xb = first["YBLOCK"], first["XBLOCK"]

    def programs(y: int, x: int) -> int:
        return -(-ynumel // y) * -(-xnumel // x)

    if programs(yb, xb) >= TILED_MIN_PROGRAMS:
        return None
    while programs(yb, xb) < TILED_MIN_PROGRAMS and (yb > 16 or xb > 16):
        if (yb >= xb and yb > 16) or xb <= 16:
            yb //= 2
        else:
            xb //= 2
    return Config(name, (("YBLOCK", yb), ("XBLOCK", xb)), max(1, min(4, yb * xb // 256)))


def column_widths(rfull: int) -> tuple[int, ...]:
    """The column blocks worth timing for a column reduction over ``rfull`` rows (a power of
    two), the heuristic's pick first. Timed on an H200 over the 50 column reductions of six
    models' graphs (ResNet-50, BERT, GPT-2 and ViT training; ConvNeXt-T and MobileNetV3
    inference), with blocks of 8, 16, 32 and 64 columns: over long columns 8 and 16 won
    every time, 32 and 64 up to 3.5x slower; over columns of at most 64 rows (each block
    holds whole columns) 16 won most, 32 or 8 the others (by up to 28 %); over 256 rows, 16.
    Keeping these gives the same winners within 2 % with 30 % fewer configurations
    compiled."""
    if rfull <= 64:
        return (16, 32, 8)
    return (16, 8) if rfull <= 256 else (8, 16)


def reduction_configs(name: str, xnumel: int, rnumel: int, column_major: bool) -> list[Config]:
    xcap, rfull = next_pow2(xnumel), next_pow2(rnumel)
    out = []
    if column_major:  # loads run along x: x blocks of contiguous columns, many rows each
        for xb in column_widths(rfull):
            xb = min(xb, xcap)
            rb = min(max(8, 2048 // xb), rfull)
            variant = "persistent" if rb >= rfull else "looped"
            out.append(Config(f"{name}_{variant}", (("XBLOCK", xb), ("RBLOCK", rb)),
                              _warps(xb * rb, 1, 4)))  # fmt: skip
        return _unique(out)
    if rfull <= PERSISTENT_MAX:
        base = max(1, min(xcap, max(1, 1024 // rfull)))
        for xb in (base, base * 2, base * 4, base * 8, max(1, base // 2)):
            xb = min(xb, xcap, 64)
            for w in (_warps(xb * rfull, 2), _warps(xb * rfull, 2) * 2):
                out.append(Config(f"{name}_persistent", (("XBLOCK", xb), ("RBLOCK", rfull)),
                                  min(w, 16)))  # fmt: skip
        # the fourth never won: on an H200 over the 35 persistent row reductions of six
        # models' graphs (see column_widths), the first won 28, the second 4, the third 3
        return _unique(out)[:PERSISTENT_CANDIDATES]
    for xb, rb, w in ((1, 2048, 8), (1, 4096, 16), (2, 1024, 8), (1, 1024, 4), (1, 8192, 16)):
        xb = min(xb, xcap)
        out.append(Config(f"{name}_looped", (("XBLOCK", xb), ("RBLOCK", rb)), w))
    if rfull <= WIDE_PERSISTENT_MAX:  # a row in registers reads its input once: the fourth
        wide = [Config(f"{name}_persistent", (("XBLOCK", 1), ("RBLOCK", rfull)), w)
                for w in (16, 32)]  # fmt: skip
        out = out[:3] + wide[:1] + out[3:] + wide[1:]  # candidate, within MAX_CANDIDATES
    return _unique(out)


def split_configs(
    name: str, xnumel: int, rnumel: int, column_major: bool, least: int | None = None
) -> list[Config]:
    """Split reductions (see kiln_triton.split) for reductions of at least ``least``
    elements (default SPLIT_MIN_RNUMEL) too few programs would run: about SPLIT_PROGRAMS
    programs in all, each over a chunk of the reduction."""
    if rnumel < (SPLIT_MIN_RNUMEL if least is None else least):
        return []
    out = []
    for xb in (32, 64) if column_major else (1,):
        xb = min(xb, next_pow2(xnumel))
        xblocks = -(-xnumel // xb)
        if xblocks >= SPLIT_BELOW_PROGRAMS:
            continue
        rb = min(max(8, 2048 // xb), next_pow2(rnumel))
        nsplit = min(next_pow2(SPLIT_PROGRAMS // xblocks), rnumel // rb, SPLIT_FINISH_TILE // xb)
        nsplit = max(2, nsplit)
        out.append(Config(f"{name}_split", (("XBLOCK", xb), ("RBLOCK", rb), ("NSPLIT", nsplit)),
                          _warps(xb * rb, 4, 8)))  # fmt: skip
    return _unique(out)


def _with_splits(
    found: list[Config], name: str, xnumel: int, rnumel: int, column: bool
) -> list[Config]:
    """``found`` with the split configurations worth timing: first for a long reduction;
    for a shorter column reduction, one after the unsplit pick (a kernel too small to be
    timed keeps that pick: the split's second launch would cost more than it saves)."""
    split = split_configs(name, xnumel, rnumel, column)
    if split:
        return split + found
    if column:
        short = split_configs(name, xnumel, rnumel, column, least=SPLIT_MIN_COLUMN_RNUMEL)
        return found[:1] + short[:1] + found[1:]
    return found


def candidates(meta: dict, numels: dict[str, int]) -> list[Config]:
    """The configurations worth timing, the heuristic's pick first: at most
    :data:`MAX_CANDIDATES`."""
    kind, name = meta["kind"], meta["name"]
    if kind == "pointwise":
        found = pointwise_configs(name, numels["xnumel"])
    elif kind == "tiled":
        found = tiled_configs(name, numels["ynumel"], numels["xnumel"])
    else:
        xnumel, rnumel, column = numels["xnumel"], numels["rnumel"], meta["column_major"]
        found = reduction_configs(name, xnumel, rnumel, column)
        if meta.get("split_parts"):
            found = _with_splits(found, name, xnumel, rnumel, column)
    return found[: max(1, MAX_CANDIDATES)]
