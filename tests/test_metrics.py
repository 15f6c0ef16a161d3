"""FLOP counting against hand counts, the roofline arithmetic, and the drift metrics against closed forms."""
from __future__ import annotations

import math

import pytest
import torch

from sdperf.measure import drift
from sdperf.model.generation import Output
from sdperf.measure.roofline import achieved, count_flops, matmul_peak


def test_conv_flops_match_hand_count():
    conv = torch.nn.Conv2d(3, 8, kernel_size=3, padding=1)
    x = torch.randn(2, 3, 16, 16)
    # every output element is a dot product of length Cin*k*k: 2 FLOPs per multiply-add
    assert count_flops(conv, x) == 2 * (3 * 3 * 3) * 8 * 16 * 16 * 2


def test_linear_flops_match_hand_count():
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(5, 7, 64)
    assert count_flops(lin, x) == 2 * 64 * 32 * 5 * 7


def test_attention_flops_match_hand_count_on_this_device():
    """QK^T and PV: 2 matmuls of 2*L*S*d FLOPs per head; the CPU kernel must not count as free."""
    q, k = torch.randn(2, 4, 64, 16), torch.randn(2, 4, 77, 16)
    got = count_flops(torch.nn.functional.scaled_dot_product_attention, q, k, k)
    assert got == 2 * (2 * 64 * 77 * 16) * 2 * 4


def test_achieved_and_percent_of_peak():
    a = achieved(flops=2e9, seconds=0.5, peak_flops_per_s=8e9)
    assert a["achieved_gflops"] == pytest.approx(4.0) and a["percent_of_peak"] == pytest.approx(50.0)


def test_matmul_peak_is_measured():
    peak, timing = matmul_peak("cpu", torch.float32, 128, min_run_time=0.05)
    assert peak > 1e8 and len(timing.times) >= 1
    assert peak == pytest.approx(2 * 128**3 / timing.median)


def _out(latents, images):
    return Output(latents=latents, images=images)


def test_drift_of_identical_output_is_zero():
    x, img = torch.randn(1, 4, 8, 8), torch.rand(1, 3, 16, 16)
    d = drift.compare(_out(x, img), _out(x.clone(), img.clone()))
    assert d["latent_rel_error"] == 0 and math.isinf(d["image_psnr_db"])
    assert drift.verdict(d) == "bit-identical to the fp32 baseline"


def test_psnr_matches_closed_form():
    img = torch.full((1, 3, 16, 16), 0.5, dtype=torch.float64)
    shifted = img + 0.01  # MSE 1e-4 -> PSNR 10*log10(1/1e-4) = 40 dB
    assert drift.psnr(shifted, img) == pytest.approx(40.0, abs=1e-4)
    x = torch.ones(10)
    assert drift.relative_error(x * 1.1, x) == pytest.approx(0.1)


def test_psnr_is_torchmetrics_psnr_without_its_import():
    from torchmetrics.functional.image import peak_signal_noise_ratio

    g = torch.Generator().manual_seed(0)
    img = torch.rand(2, 3, 32, 32, generator=g)
    noisy = (img + 0.03 * torch.randn(img.shape, generator=g)).clamp(0, 1)
    assert drift.psnr(noisy, img) == pytest.approx(float(peak_signal_noise_ratio(noisy.double(), img.double(),
                                                                                  data_range=1.0)), rel=1e-6)


def test_nan_output_is_reported_broken():
    x, img = torch.randn(1, 4, 8, 8), torch.rand(1, 3, 16, 16)
    bad = img.clone()
    bad[0, 0, 0, 0] = float("nan")
    d = drift.compare(_out(x, bad), _out(x, img))
    assert math.isnan(d["image_psnr_db"]) and drift.verdict(d).startswith("broken")


def test_drift_refuses_different_workloads():
    with pytest.raises(ValueError, match="same workload"):
        drift.compare(_out(torch.zeros(1, 4, 8, 8), torch.zeros(1, 3, 16, 16)),
                      _out(torch.zeros(2, 4, 8, 8), torch.zeros(2, 3, 16, 16)))
