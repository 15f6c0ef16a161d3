"""Quality of catalog techniques on the committed reference model: paired deltas, the budget verdict, rows that
round-trip through results.csv, and the two techniques (DeepCache, token merging) doing what they claim."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sdperf.errors import ConfigError
from sdperf.reference import quality, store, techniques

N, STEPS = 16, 10


@pytest.fixture(scope="module")
def smoke_profile():
    from sdperf.profiles import load_profile

    return load_profile("smoke")


@pytest.fixture(scope="module")
def measured(smoke_profile, tmp_path_factory):
    keys = ["grad:no_grad", "scheduler:dpmpp-2m@10", "deepcache:3", "tome:0.5", "cuda_graphs"]
    return techniques.measure(keys, smoke_profile, n=N, steps=STEPS, scratch=tmp_path_factory.mktemp("art"),
                              say=lambda _: None)


def test_a_lossless_technique_is_identical_and_a_lossy_one_is_paired_with_intervals(measured):
    t = measured.set_index("key")
    same = t.loc["grad:no_grad"]
    assert same.status == "ok" and same.adherence_delta == 0 and same.fid_delta == 0
    assert math.isinf(same.psnr_db_median) and same.quality_verdict == techniques.WITHIN
    for key in ("scheduler:dpmpp-2m@10", "deepcache:3", "tome:0.5"):
        r = t.loc[key]
        assert r.status == "ok" and np.isfinite(r.psnr_db_median), key
        assert r.adherence_delta_lo <= r.adherence_delta <= r.adherence_delta_hi, key
        assert r.fid_delta_lo <= r.fid_delta_hi, key
        assert r.quality_verdict in (techniques.WITHIN, techniques.OVER, techniques.UNDECIDED), key
    assert t.loc["cuda_graphs"].status == "not_applicable" and "CUDA" in t.loc["cuda_graphs"].note
    assert t.loc["scheduler:dpmpp-2m@10"].steps == 10 and t.loc["deepcache:3"].steps == STEPS


def test_deepcache_runs_the_deep_branch_only_every_interval_calls():
    from sdperf.optimizations import feature_reuse

    pipe = store.load()[0]
    deep, calls = [], []
    compute = pipe.unet.mid_block.forward  # counted below DeepCache's wrapper: a reused output never reaches it
    pipe.unet.mid_block.forward = lambda *a, **k: deep.append(1) or compute(*a, **k)
    pipe.unet.register_forward_pre_hook(lambda *a: calls.append(len(deep)))
    feature_reuse.apply(pipe, 3)
    techniques.render(pipe, ["a small red circle at the top left on a light background"], [0], STEPS)
    timesteps = list(pipe.scheduler.timesteps)
    assert len(calls) == len(timesteps) == STEPS + 1  # PLMS evaluates its first timestep twice
    # DeepCache counts steps by the timestep's first index in the schedule: a full UNet at every third
    assert len(deep) == sum(1 for t in timesteps if timesteps.index(t) % 3 == 0) < len(calls)
    # the pattern the worker composes per-image times from is the one that ran, call by call
    ran = ["full" if after > before else "cached" for before, after in zip(calls, calls[1:] + [len(deep)])]
    assert feature_reuse.call_kinds([float(t) for t in timesteps], 3) == ran


def test_token_merging_patches_the_highest_resolution_blocks_and_changes_the_picture():
    from sdperf.optimizations import token_merging

    caption = ["a large blue square at the bottom right on a dark background"]
    pipe = store.load()[0]
    base, _ = techniques.render(pipe, caption, [0], STEPS)
    token_merging.apply(pipe, 0.5, seed=0)
    assert token_merging.merged_blocks(pipe.unet) > 0
    merged, _ = techniques.render(pipe, caption, [0], STEPS)
    again = store.load()[0]
    token_merging.apply(again, 0.5, seed=0)
    assert not np.array_equal(base, merged)
    assert np.array_equal(merged, techniques.render(again, caption, [0], STEPS)[0])  # seeded: the same merges


def test_the_paired_fid_interval_is_narrower_than_the_unpaired_spread():
    g = torch.Generator().manual_seed(0)
    real = quality.Real(torch.randn(400, 8, generator=g, dtype=torch.float64))
    base = torch.randn(200, 8, generator=g, dtype=torch.float64) * 1.2
    variant = base + 0.01 * torch.randn(200, 8, generator=g, dtype=torch.float64)
    d, lo, hi = techniques.fid_delta(variant, base, real, n_resamples=100)
    f_lo, f_hi = quality.fid_interval(base, real, n_resamples=100)
    assert lo <= d <= hi and (hi - lo) < (f_hi - f_lo) / 5


@pytest.mark.parametrize("a_lo, a_hi, f_lo, f_hi, expected", [
    (-0.005, 0.004, -1.0, 2.0, techniques.WITHIN),
    (-0.05, -0.02, -1.0, 2.0, techniques.OVER),     # adherence wholly below -1 point
    (-0.005, 0.004, 11.0, 15.0, techniques.OVER),  # FID change beyond its interval plus 10% of 100
    (-0.005, 0.004, 10.5, 30.0, techniques.OVER),  # lower end just past the margin
    (-0.02, 0.01, -1.0, 2.0, techniques.UNDECIDED),  # adherence straddles -1 point
    (-0.005, 0.004, 5.0, 12.0, techniques.WITHIN),   # FID within its interval plus the margin (lower end 5 <= 10)
    (-0.005, 0.004, -9.4, 10.2, techniques.WITHIN),  # a wide interval around no change: noise, not a cost
    (-0.02, 0.01, 11.0, 15.0, techniques.OVER),      # FID decides even when adherence is undecided
])
def test_the_budget_verdict(a_lo, a_hi, f_lo, f_hi, expected):
    assert techniques.verdict(a_lo, a_hi, f_lo, f_hi, base_fid=100.0) == expected


def test_rows_round_trip_and_for_study_measures_only_what_is_missing(measured, scratch_reports, monkeypatch):
    from sdperf.study import open_study

    study = open_study("smoke", notebook="12_fid_clip")
    techniques.record(study, measured)
    keys = ["grad:no_grad", "scheduler:dpmpp-2m@10", "deepcache:3", "tome:0.5", "cuda_graphs"]
    back = techniques.from_rows(study.recorder.current(), keys, N, STEPS).set_index("key")
    for key in ("grad:no_grad", "deepcache:3", "tome:0.5"):
        for col in ("adherence_delta", "adherence_delta_lo", "fid_delta", "fid_delta_hi", "psnr_db_median"):
            assert back.loc[key, col] == pytest.approx(measured.set_index("key").loc[key, col]), (key, col)
        assert back.loc[key, "quality_verdict"] == measured.set_index("key").loc[key, "quality_verdict"]
    assert back.loc["cuda_graphs", "status"] == "not_applicable"
    asked = []
    monkeypatch.setattr(techniques, "measure", lambda ks, *a, **k: asked.append(ks) or measured.iloc[:1])
    techniques.for_study(study, keys, n=N, steps=STEPS, say=lambda _: None)
    assert asked == []  # everything was in results.csv
    with pytest.raises(ConfigError, match="unknown technique 'warp'"):
        techniques.for_study(study, ["warp"], n=N, steps=STEPS)
