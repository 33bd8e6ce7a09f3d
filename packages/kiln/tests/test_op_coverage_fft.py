"""The op-coverage corpus: discrete Fourier transforms (complex intermediates between real
inputs and real outputs, or complex outputs) and the shifts around them. See
test_op_coverage.py."""

from __future__ import annotations

import pytest
import torch
from op_corpus import LOOSE, Frame, check_frame

fft = torch.fft

FRAMES = {
    "fft_abs": Frame(lambda x: fft.fft(x.sin()).abs() * 2, ((3, 8),), **LOOSE),
    "fft_complex_output": Frame(lambda x: fft.fft(x * 2, dim=0), ((6, 3),), **LOOSE),
    "ifft_real_part": Frame(lambda x: fft.ifft(fft.fft(x) * 2).real + x, ((4, 6),), **LOOSE),
    "rfft": Frame(
        lambda x: torch.view_as_real(fft.rfft(x.cos(), norm="ortho")), ((4, 8),), **LOOSE
    ),
    "irfft": Frame(lambda x: fft.irfft(fft.rfft(x) * 0.5, n=8) - x, ((3, 8),), **LOOSE),
    "fft2_angle": Frame(lambda x: fft.fft2(x.sin()).angle() * 2, ((4, 5),), **LOOSE),
    "ifft2": Frame(lambda x: fft.ifft2(x.exp().to(torch.complex64)).abs(), ((4, 4),), **LOOSE),
    "rfft2_norm_forward": Frame(
        lambda x: fft.rfft2(x.cos(), norm="forward").abs().sum(-1), ((2, 4, 6),), **LOOSE
    ),
    "fftn_dims": Frame(lambda x: fft.fftn(x.exp(), dim=(0, 2)).imag + 1, ((3, 2, 4),), **LOOSE),
    "hfft": Frame(lambda x: fft.hfft(fft.rfft(x.sin())), ((2, 6),), **LOOSE),
    "fftshift": Frame(lambda x: fft.fftshift(x.sin()) * 2, ((4, 5),), fused=True),
    "ifftshift_dim": Frame(lambda x: fft.ifftshift(x, dim=1) + x, ((3, 6),), fused=True),
    "spectrum_shifted": Frame(
        lambda x: fft.fftshift(fft.rfft(x, dim=0).abs(), dim=1), ((8, 5),), **LOOSE
    ),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_compiles_and_matches_eager(name, tmp_path, caplog):
    check_frame(name, FRAMES[name], tmp_path, caplog)
