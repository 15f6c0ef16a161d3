"""Generated-image folders and their scoring: manifest, per-guidance grouping, one resize method, stand-in
reference, and the rung comparison on the tiny pipeline (a bit-identical rung scores FID 0 and PSNR inf)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sdperf.core.errors import ConfigError
from sdperf.imagegen import read_manifest
from sdperf.model.prompts import smoke_captions
from sdperf.quality import fid, images, rungs, score
from sdperf.quality.quality_settings import settings


@pytest.fixture(scope="module")
def scorers():
    """Inception at random init (64 features: fast); CLIP left out where a test does not need it."""
    return score.Scorers(fid.inception(None, 64, seed=0), None, 256, 4, 64)


@pytest.fixture(scope="module")
def folder(tiny_pipe, smoke, tmp_path_factory):
    from sdperf.imagegen import generate_folder

    out = tmp_path_factory.mktemp("gen")
    generate_folder(dataclasses.replace(smoke, seed=5), smoke_captions()[:3], out, guidance_scales=[1.5, 8.0],
                    pipe=tiny_pipe, steps=2, progress=False)
    return out


def test_each_captions_noise_is_reused_at_every_guidance_scale(folder):
    m = read_manifest(folder).sort_values(["guidance", "prompt_id"])
    assert [(r.prompt_id, r.guidance, r.seed) for r in m.itertuples()] == [
        ("1", 1.5, 5), ("2", 1.5, 6), ("3", 1.5, 7), ("1", 8.0, 5), ("2", 8.0, 6), ("3", 8.0, 7)]
    assert m.file.is_unique


def test_a_technique_pipeline_is_recorded_with_its_grad_mode_and_not_resumed_into_by_another(tiny_pipe, smoke,
                                                                                               tmp_path):
    from sdperf.imagegen import generate_folder

    generate_folder(smoke, smoke_captions()[:1], tmp_path, pipe=tiny_pipe, steps=1, progress=False,
                    grad_mode="no_grad", technique="grad:no_grad")
    run = (tmp_path / "run.json").read_text()
    assert '"grad_mode": "no_grad"' in run and '"technique": "grad:no_grad"' in run
    with pytest.raises(ConfigError, match="technique: folder has 'grad:no_grad', this run 'grad:grad'"):
        generate_folder(smoke, smoke_captions()[:1], tmp_path, pipe=tiny_pipe, steps=1, progress=False,
                        grad_mode="no_grad", technique="grad:grad")
    with pytest.raises(ConfigError, match="grad_mode 'off' is not valid; choose one of: grad, no_grad"):
        generate_folder(smoke, smoke_captions()[:1], tmp_path / "x", pipe=tiny_pipe, grad_mode="off")


def test_folder_has_a_manifest_naming_every_png(folder, smoke):
    m = read_manifest(folder)
    assert list(m.columns[:6]) == ["key", "prompt_id", "caption", "guidance", "seed", "file"]
    assert len(m) == 6 and sorted(m.guidance.unique()) == [1.5, 8.0]
    u8, pil = images.load_for_scoring(list(m.path[:2]), None)
    assert u8.dtype == torch.uint8 and u8.shape == (2, 3, smoke.resolution, smoke.resolution)
    big, pil = images.load_for_scoring(list(m.path[:2]), 256)
    assert big.shape[-2:] == (256, 256) and pil[0].size == (256, 256)


def test_scoring_a_folder_groups_by_guidance_and_merges_like_the_whole(folder, scorers):
    per_g = score.score_folder(scorers, folder)
    assert sorted(per_g) == [1.5, 8.0] and all(v.n == 3 for v in per_g.values())
    whole = score.score_files(scorers, list(read_manifest(folder).path))
    merged = fid.merge(v.stats for v in per_g.values())
    for a, b in zip(fid.mu_sigma(merged), fid.mu_sigma(whole.stats)):
        torch.testing.assert_close(a, b)
    assert fid.fid(per_g[1.5].stats, per_g[1.5].stats) == pytest.approx(0, abs=1e-6)


def test_manifest_problems_are_named(folder, tmp_path):
    with pytest.raises(ConfigError, match="manifest.csv' does not exist"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.csv").write_text((folder / "manifest.csv").read_text())
    with pytest.raises(ConfigError, match="names 6 image\\(s\\) that are not in the folder"):
        read_manifest(tmp_path)


def test_standin_reference_is_seeded_and_labelled(scorers, smoke):
    a, b = images.standin_images(3, 32, seed=1), images.standin_images(3, 32, seed=1)
    assert torch.equal(a, b) and a.dtype == torch.uint8 and not torch.equal(a, images.standin_images(3, 32, 2))
    ref = score.reference(scorers, settings(smoke), n_standin=3, seed=1)
    assert ref.n == 3 and "machinery only" in ref.what and ref.mu.shape == (64,)


def test_reference_npz_path(scorers, smoke, tmp_path):
    stats = fid.stats_of(torch.randn(10, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    path = fid.save_stats(stats, tmp_path / "ref.npz")
    s = dataclasses.replace(settings(smoke), reference=path)
    ref = score.reference(scorers, s, n_standin=3, seed=1)
    assert ref.n == 10 and torch.allclose(ref.mu, fid.mu_sigma(stats)[0])


def test_rungs_compare_with_the_fp32_images(smoke, scorers, scratch_reports):
    from sdperf.store.results import Recorder
    from sdperf.measure.study import open_study

    study = open_study("smoke", notebook="12_fid_clip")
    # the stand-alone row 02_inference_mode stored on this machine at this commit, found by key
    Recorder("02_inference_mode", "smoke", study.env).add(
        "whatever label, batch 1", "speedup_vs_fp32", 1.07, "x", lo=1.05, hi=1.09, key="grad:inference_mode",
        method="fresh process per configuration", batch_size=1, verdict="faster", note="per image")
    s = dataclasses.replace(settings(smoke), ladder_n_images=2, steps=2)
    out = rungs.generate(study, s, ["grad:inference_mode", "cuda_graphs"], say=lambda _: None)
    assert [r.status for r in out] == ["ok", "ok", "not_applicable"]
    table = rungs.score_rungs(study, s, dataclasses.replace(scorers, clip=_FakeClip()), out)
    same = table[table.key == "grad:inference_mode"].iloc[0]
    assert same[s.label("fid_vs_baseline")] == 0 and same.psnr_db_median == np.inf and same.clip_change == 0
    assert same.speedup_vs_fp32 == 1.07 and (same.speedup_lo, same.speedup_hi) == (1.05, 1.09)
    assert same.speed_verdict == "faster" and same.speed_method.startswith("fresh process")
    assert "CUDA" in table[table.key == "cuda_graphs"].iloc[0].note
    stored = study.recorder.table()
    assert set(stored.status) == {"ok", "not_applicable"} and stored.metric.str.contains("machinery only").any()
    assert set(stored.key) == {"fp32-eager", "grad:inference_mode", "cuda_graphs"}
    with pytest.raises(ConfigError, match="unknown technique 'warp-drive'"):
        rungs.check_keys(["warp-drive"])


class _FakeClip:
    """CLIP stand-in for the rung test: a score per image from its mean brightness (deterministic, cheap)."""

    def scores(self, pil, texts, batch=16):
        return torch.tensor([float(np.asarray(im).mean()) / 2.55 for im in pil], dtype=torch.float64)
