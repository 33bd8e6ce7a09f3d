"""The heuristics' launch configurations (no GPU needed: they are plain data)."""

import pytest

from kiln_triton.configs import TILED_MIN_PROGRAMS, tiled_configs


def programs(config, ynumel: int, xnumel: int) -> int:
    blocks = dict(config.blocks)
    return -(-ynumel // blocks["YBLOCK"]) * -(-xnumel // blocks["XBLOCK"])


def test_a_small_tiled_space_is_spread_over_more_programs_first():
    # Llama's rotary table: cos and sin of a transposed 128x64 read
    first, *rest = tiled_configs("k", 128, 64)
    assert programs(first, 128, 64) == 32  # tiles of 16x16: the smallest allowed
    assert dict(first.blocks) == {"YBLOCK": 16, "XBLOCK": 16} and first.num_warps == 1
    assert programs(rest[0], 128, 64) == 2  # the big tiles stay as candidates after it
    first, _ = tiled_configs("k", 512, 256)[:2]
    assert programs(first, 512, 256) >= TILED_MIN_PROGRAMS
    assert dict(first.blocks) == {"YBLOCK": 32, "XBLOCK": 64}


def test_a_big_tiled_space_keeps_the_big_tiles_first():
    first = tiled_configs("k", 4096, 1024)[0]
    assert dict(first.blocks) == {"YBLOCK": 64, "XBLOCK": 64} and first.num_warps == 4


@pytest.mark.parametrize("xnumel, rnumel", [(64, 100352), (128, 25088), (1, 1 << 22), (3, 9000)])
def test_a_split_reduction_s_finish_combines_a_bounded_tile_of_partials(xnumel, rnumel):
    """The finish holds XBLOCK x SPLIT_BLOCK partials at once: 64 x 1024 Welford partials
    took 14 s to compile (a batch norm's statistics over 64 channels)."""
    from kiln_triton.configs import SPLIT_FINISH_TILE, next_pow2, split_configs

    found = split_configs("k", xnumel, rnumel, column_major=True)
    assert found
    for config in found:
        blocks = dict(config.blocks)
        assert blocks["XBLOCK"] * next_pow2(blocks["NSPLIT"]) <= SPLIT_FINISH_TILE, config


@pytest.mark.parametrize(
    "rnumel, widths", [(49, (16, 32, 8)), (256, (16, 8)), (784, (8, 16)), (25088, (8, 16))]
)
def test_column_reductions_time_the_column_blocks_that_won(rnumel, widths):
    """Blocks of 8 or 16 columns won over long columns (32 and 64 up to 3.5x slower); over
    columns of at most 64 rows 16 won most, 32 and 8 the others."""
    from kiln_triton.configs import reduction_configs

    found = reduction_configs("k", 4096, rnumel, column_major=True)
    assert tuple(dict(c.blocks)["XBLOCK"] for c in found) == widths
    for c in found:  # whole columns where they fit, else looped over rows
        blocks = dict(c.blocks)
        whole = blocks["RBLOCK"] * 1 >= rnumel
        assert c.variant == ("k_persistent" if whole else "k_looped"), c


def test_a_persistent_row_reduction_times_three_candidates():
    """The heuristic's block and warps, twice the warps, twice the rows: a fourth never won."""
    from kiln_triton.configs import reduction_configs

    found = reduction_configs("k", 8192, 768, column_major=False)
    assert len(found) == 3 and all(c.variant == "k_persistent" for c in found)
    (x0, w0), (x1, w1), (x2, _) = [(dict(c.blocks)["XBLOCK"], c.num_warps) for c in found]
    assert (x1, w1) == (x0, 2 * w0) and x2 == 2 * x0
