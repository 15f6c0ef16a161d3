"""Quality of catalog techniques on the committed reference model, judged against the converged fp32 solve: the
paired measures and the budget, the controls (a twin must read within, a known harm over), rows that round-trip
through results.csv, and the two techniques (DeepCache, token merging) doing what they claim."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from sdperf.core.errors import ConfigError
from sdperf.judge import controls, paired, technique_setup, techniques
from sdperf.refmodel import domain_quality, storage
from sdperf.judge.technique_setup import SOLVE_BATCH

STEPS = 10
# the smoke scale: one batch of 8 images, a short convergence ladder; noise of std 4 on the UNet's output cost 42
# points of adherence on 64 images at the cpu profile's settings: a harm no budget may miss
# (key_budget_s: the time gate runs, call by call, and never trips: its calls must give what one go gives)
PLAN = techniques.Plan(guidances=(7.5,), n_max=8, n_step=8, doses=(4.0,), ladder=(5, 10, 20), check_images=8,
                       independent_steps=160, key_budget_s=1e6)
FEW = f"control:dpmpp-2m@{controls.FEW_STEPS}:karras"  # the positive control: the reference's own sampler at 4 steps
KEYS = [controls.TWIN, FEW, controls.noise_key(4.0), "grad:no_grad",
        "scheduler:euler@10", "cuda_graphs"]


@pytest.fixture(scope="module")
def smoke_profile():
    from sdperf.config.profiles import load_profile

    return load_profile("smoke")


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    return tmp_path_factory.mktemp("art")


@pytest.fixture(scope="module")
def measured(smoke_profile, art):
    return techniques.measure(KEYS, smoke_profile, plan=PLAN, scratch=art, say=lambda _: None)


def test_the_twin_is_identical_and_within_and_a_known_harm_is_over(measured):
    t = measured.set_index("key")
    twin = t.loc[controls.TWIN]  # the converged solve's own computation, by a fresh pipeline: nothing moves
    assert twin.status == "ok" and twin.adherence_delta == 0 and twin.soft_adherence_delta == 0
    assert twin.latent_mse == 0 and math.isinf(twin.psnr_db_median) and twin.quality_verdict == paired.WITHIN
    assert twin.n_images == PLAN.n_step  # settled at the first batch: a zero-width interval is clear of the line
    same = t.loc["grad:no_grad"]  # lossless, at the engines' batch of 16: rounding only, far inside the budget
    assert same.adherence_delta_lo <= 0 <= same.adherence_delta_hi and abs(same.soft_adherence_delta) < 1e-4
    assert same.latent_mse < 1e-6 and same.quality_verdict == paired.WITHIN
    harm = t.loc[controls.noise_key(4.0)]
    assert harm.quality_verdict == paired.OVER and harm.adherence_delta_hi < -paired.ADHERENCE_BUDGET
    assert harm.latent_mse > t.loc["scheduler:euler@10"].latent_mse > 0
    ok, why = techniques.trust(measured, techniques.Plan(**{**PLAN.__dict__}))
    few = t.loc[FEW]
    assert ok == (few.quality_verdict == paired.OVER), why  # trust is exactly "every control as it must read"
    assert t.loc["cuda_graphs"].status == "not_applicable" and "CUDA" in t.loc["cuda_graphs"].note


def test_every_measure_has_its_interval_and_the_sampler_runs_its_own_steps(measured):
    r = measured.set_index("key").loc["scheduler:euler@10"]
    assert r.status == "ok" and r.steps == 10
    for col in ("adherence_delta", "soft_adherence_delta", "latent_mse", "ssim", "fid_delta", "kid_delta"):
        assert r[f"{col}_lo"] <= r[col] <= r[f"{col}_hi"], col
    assert 0 < r.ssim < 1 and np.isfinite(r.psnr_db_median)
    for name in ("fid", "kid"):  # at 8 images a distance may not resolve its margin: then it must not vote
        v = r[f"{name}_verdict"]
        assert v in (paired.WITHIN, paired.OVER, paired.UNDECIDED) or v == f"unresolved at n={int(r.n_images)}"
    assert (r.first_timestep, r.last_timestep) == (901, 1)  # the model's leading spacing: euler@10 starts below
    ref = measured[measured.key.str.startswith(techniques.REFERENCE)]
    assert len(ref) == 1 and ref.iloc[0].key == f"converged:dpmpp-2m@{int(ref.iloc[0].steps)}:karras"
    assert (ref.iloc[0].first_timestep, ref.iloc[0].last_timestep) == (999, 0)  # from the noise's own level
    conv = measured.attrs["convergence"]
    assert list(conv.steps)[:1] == [5] and (conv.doubled == 2 * conv.steps).all()
    assert (conv.first_timestep == 999).all() and (conv.independent == "euler@160:trailing").all()
    last = conv.iloc[-1]  # converged means both legs within the share; otherwise the last count, not converged
    assert (last.share < 0.05 and last.independent_share < 0.05) == bool(last.converged)
    assert measured.attrs["former"].iloc[0].first_timestep == 951  # the reference before issue 60, measured too


def test_a_reference_started_below_the_noise_level_is_rejected_by_the_independent_leg(measured, art):
    """DPM-Solver++ with the model's own leading spacing (from t=951, the study's reference before issue 60) on
    the real reference model: doubling its 25 steps moves it by little, so the doubling leg alone calls it
    converged; the independent Euler solve from t=999 does not, and the check says not converged. The solves are
    the judging fixture's (its cache: the same model, captions, noise and guidance), but the leading 50 steps."""
    from sdperf.model.pipelines import build_from_weights
    from sdperf.judge import converged

    folder = storage.default_dir()
    caps, seeds = [s.caption for s in domain_quality.prompts(PLAN.check_images)], list(range(PLAN.check_images))

    def render(sampler, steps, c, d):
        pipe = build_from_weights(str(folder), sampler)
        return converged.Solve(*domain_quality.generate_with_latents(pipe, c, d, 7.5, steps, batch=SOLVE_BATCH, pad=False))

    solver = converged.Solver(render, converged.model_hash(storage.verify(folder)), 7.5, converged.cache_dir(art.parent))
    independent, fastest = (converged.INDEPENDENT, PLAN.independent_steps), ("euler", 10)
    got = converged.converge(solver, caps, seeds, fastest, ladder=(25,), independent=independent, former=None,
                             sampler="dpmpp-2m")
    row = got.rows[0]
    assert row["share"] < converged.SHARE <= row["independent_share"] and not got.converged, row
    fixed = converged.converge(solver, caps, seeds, fastest, ladder=(PLAN.ladder[-1],), independent=independent,
                               former=None)  # from t=999 on Karras's levels: both legs hold
    assert fixed.converged and fixed.rows[0]["independent_share"] < converged.SHARE, fixed.rows[0]
    assert solver.made == PLAN.check_images  # only the leading 50-step solve was new


def test_a_second_run_reads_the_techniques_renders_back_builds_nothing_and_renders_the_controls(
        measured, smoke_profile, art, monkeypatch):
    """The render cache (sdperf.judge.renders): a run on the same machine and model, with the same technique
    code and libraries, reads each technique's batches back and builds no pipeline for them; its numbers are the
    first run's; the controls are rendered again; other technique code is another key."""
    from sdperf.judge import renders

    built, build = [], technique_setup.build
    monkeypatch.setattr(technique_setup, "build", lambda control, stack, *a: built.append(
        control.key if control else stack.key) or build(control, stack, *a))
    keys = [controls.TWIN, "grad:no_grad", "scheduler:euler@10"]
    said = []
    again = techniques.measure(keys, smoke_profile, plan=PLAN, scratch=art, say=said.append).set_index("key")
    first = measured.set_index("key")
    assert built == [controls.TWIN]
    assert again.loc[controls.TWIN, "cached_images"] == 0 and first.loc[controls.TWIN, "cached_images"] == 0
    for key in ("grad:no_grad", "scheduler:euler@10"):
        assert first.loc[key, "cached_images"] == 0  # the first run rendered them
        assert again.loc[key, "cached_images"] == again.loc[key, "n_images"] == first.loc[key, "n_images"]
        for col in ("adherence_delta", "adherence_delta_lo", "soft_adherence_delta", "latent_mse", "ssim",
                    "fid_delta", "kid_delta", "quality_verdict"):
            assert again.loc[key, col] == first.loc[key, col], (key, col)
    assert any("grad:no_grad @ 7.5: n=8 (8 read back from the render cache)" in s for s in said)
    monkeypatch.setattr(renders, "code_hash", lambda: "technique code edited")
    third = techniques.measure(["scheduler:euler@10"], smoke_profile, plan=PLAN, scratch=art, say=lambda _: None)
    assert built[-1] == "scheduler:euler@10" and third.set_index("key").loc["scheduler:euler@10", "cached_images"] == 0


def test_the_real_side_is_computed_once_per_evaluator_and_handed_out_as_a_copy(monkeypatch):
    from sdperf.refmodel import evaluator

    torch.manual_seed(0)
    net, other = evaluator.Evaluator(32).eval(), evaluator.Evaluator(32).eval()
    renders = []
    real_held_out = evaluator.held_out
    monkeypatch.setattr(evaluator, "held_out", lambda n, r: renders.append(n) or real_held_out(n, r))
    first = domain_quality.Real.of(net, 24)
    first.features.add_(1.0)  # a caller's change stays in its own copy
    again = domain_quality.Real.of(net, 24)
    assert renders == [24] and not torch.equal(first.features, again.features)
    assert torch.equal(again.features, evaluator.features(net, real_held_out(24, 32)[1]))
    domain_quality.Real.of(other, 24)
    domain_quality.Real.of(net, 16)
    with torch.no_grad():
        next(net.parameters()).view(-1)[0] += 1e-3  # one weight moved: the digest changes, the set is computed again
    domain_quality.Real.of(net, 24)
    assert renders == [24, 24, 16, 24]


def test_soft_adherence_equals_the_checks_for_certain_predictions():
    from sdperf.refmodel import domain, evaluator

    items = domain.scenes(5, 40)
    truth = domain.labels_many(items)
    rng = np.random.default_rng(0)
    pred = truth.copy()
    flip = rng.random(len(pred)) < 0.5  # half the images get one quadrant's shape wrong
    pred[flip, 0] = (pred[flip, 0] % 3) + 1
    empty = pred[:, 0] == domain.NONE
    pred[empty, 1] = pred[empty, 2] = domain.IGNORE

    def one_hot(labels, n):
        out = np.zeros(labels.shape + (n,))
        np.put_along_axis(out, np.clip(labels, 0, n - 1)[..., None], 1.0, -1)
        return out

    q = pred[:, :12].reshape(-1, 4, 3)
    probs = {"shape": one_hot(q[..., 0], evaluator.N_SHAPE), "colour": one_hot(q[..., 1], evaluator.N_COLOUR),
             "size": one_hot(q[..., 2], evaluator.N_SIZE), "background": one_hot(pred[:, -1], evaluator.N_BACKGROUND)}
    np.testing.assert_allclose(evaluator.soft_adherence(probs, truth), evaluator.adherence_checks(pred, truth))
    soft = {k: 0.9 * v + 0.1 / v.shape[-1] for k, v in probs.items()}  # less certain: lower, never higher
    assert (evaluator.soft_adherence(soft, truth) < evaluator.adherence_checks(pred, truth) + 1e-12).all()


@pytest.mark.parametrize("a, s, fid, kid, expected", [
    ((-0.004, 0.003), (-0.002, 0.001), (-1.0, 1.0), (-0.1, 0.1), paired.WITHIN),
    ((-0.05, -0.02), (-0.002, 0.001), (-1.0, 1.0), (-0.1, 0.1), paired.OVER),  # adherence wholly below -1 point
    ((-0.004, 0.003), (-0.04, -0.015), (-1.0, 1.0), (-0.1, 0.1), paired.OVER),  # soft adherence alone says over
    ((-0.02, 0.01), (-0.002, 0.001), (-1.0, 1.0), (-0.1, 0.1), paired.UNDECIDED),  # straddles the line
    ((-0.004, 0.003), (-0.002, 0.001), (4.0, 6.0), (-0.1, 0.1), paired.OVER),  # FID resolves a rise past 3
    ((-0.004, 0.003), (-0.002, 0.001), (-9.0, 12.0), (-0.1, 0.1), paired.WITHIN),  # FID unresolved: no vote
    ((-0.004, 0.003), (-0.002, 0.001), (-1.0, 1.0), (0.4, 0.45), paired.OVER),  # KID resolves a rise past 0.3
])
def test_the_budget(a, s, fid, kid, expected):
    m = dict(n_images=256, adherence_delta_lo=a[0], adherence_delta_hi=a[1], soft_adherence_delta_lo=s[0],
             soft_adherence_delta_hi=s[1], fid_delta_lo=fid[0], fid_delta_hi=fid[1], fid_margin=3.0,
             kid_delta_lo=kid[0], kid_delta_hi=kid[1], kid_margin=0.3)
    got = paired.decide(m)
    assert got["quality_verdict"] == expected
    if fid[1] - fid[0] > 6.0:
        assert got["fid_verdict"] == "unresolved at n=256"


def test_the_paired_distance_interval_is_narrower_than_the_unpaired_spread():
    g = torch.Generator().manual_seed(0)
    real = domain_quality.Real(torch.randn(400, 8, generator=g, dtype=torch.float64))
    base = torch.randn(200, 8, generator=g, dtype=torch.float64) * 1.2
    variant = base + 0.01 * torch.randn(200, 8, generator=g, dtype=torch.float64)
    d, lo, hi = paired.distance_delta(variant, base, domain_quality.fid_to(real), n_resamples=100)
    f_lo, f_hi = domain_quality.fid_interval(base, real, n_resamples=100)
    assert lo <= d <= hi and (hi - lo) < (f_hi - f_lo) / 5
    k, k_lo, k_hi = paired.distance_delta(variant, base, paired.kid_to(real.features), n_resamples=100)
    assert k_lo <= k <= k_hi and abs(paired.kid(base, base)) < paired.kid(base * 3, real.features)
    from torchmetrics.image.kid import poly_mmd  # equal sizes: torchmetrics' own estimator, to rounding

    assert paired.kid(base, real.features[:200]) == pytest.approx(float(poly_mmd(real.features[:200], base)))
    # unequal sizes stay unbiased: a sample of the real distribution scores about 0, far below a shifted one
    assert abs(paired.kid(real.features[:50], real.features[50:])) < paired.kid(base[:50] + 1, real.features) / 10


def test_the_batched_bootstrap_scores_each_resample_as_the_set_itself_would():
    """FidTo/KidTo.resampled (every resample from weighted sums, one batched eigenvalue call) against scoring each
    resampled set on its own, with the same draws: the same numbers to float64 rounding, repeats included."""
    g = torch.Generator().manual_seed(1)
    real = domain_quality.Real(torch.randn(300, 8, generator=g, dtype=torch.float64))
    fake = torch.randn(40, 8, generator=g, dtype=torch.float64) * 1.3 + 0.2
    rng = np.random.default_rng(7)
    picks = [rng.integers(len(fake), size=len(fake)) for _ in range(25)]
    counts = domain_quality.draws(np.random.default_rng(7), len(fake), 25)
    assert (counts == np.stack([np.bincount(p, minlength=len(fake)) for p in picks])).all()
    assert (counts.max(axis=1) > 1).all()  # every resample repeats some image
    for of in (domain_quality.fid_to(real), paired.kid_to(real.features)):
        one_by_one = [of(fake[torch.as_tensor(p)]) for p in picks]
        np.testing.assert_allclose(of.resampled(fake, counts), one_by_one, rtol=1e-9, atol=1e-12)
    whole = np.ones((1, len(fake)), dtype=int)  # each image once: the set's own score
    assert domain_quality.fid_to(real).resampled(fake, whole)[0] == pytest.approx(domain_quality.domain_fid(fake, real), rel=1e-9)


def test_the_time_gate_predicts_the_first_batch_from_its_second_call(monkeypatch):
    """Calls of 4 prompts for a first batch of 16: the first call (a compile, say) is not the one timed; the second
    predicts 4 calls; over the budget it stops there, under it every call is made. A first call longer than the
    whole budget stops at once."""
    clock = iter([0.0, 10.0, 10.0, 12.5, 12.5, 15.0, 15.0, 17.5, 100.0, 108.0, 108.0, 110.5, 200.0, 220.0])
    monkeypatch.setattr(techniques.time, "perf_counter", lambda: next(clock))
    made = []

    def render(caps, seeds):
        made.append(list(seeds))
        return caps

    ref = type("R", (), {"captions": [f"c{i}" for i in range(20)], "seeds": list(range(20))})()
    plan = techniques.Plan(n_max=20, n_step=16, key_budget_s=12.0)
    got = techniques._gated_first_batch(render, ref, plan, batch=4)
    assert made == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]] and len(got) == 4
    made.clear()
    with pytest.raises(techniques.OverBudget) as err:  # an 8 s first call, then 2.5 s: 4 x 2.5 = 10 s > 9 s
        techniques._gated_first_batch(render, ref, replace(plan, key_budget_s=9.0), batch=4)
    assert len(made) == 2 and err.value.predicted_s == pytest.approx(10.0)
    assert "first 16 images would take about 10 s here (4 calls of 2.5 s" in str(err.value)
    assert "reference_key_budget_s of 9 s" in str(err.value)
    made.clear()
    with pytest.raises(techniques.OverBudget) as err:  # a 20 s first call alone is over a 9 s budget: no second
        techniques._gated_first_batch(render, ref, replace(plan, key_budget_s=9.0), batch=4)
    assert len(made) == 1 and "timed on its first call" in str(err.value)


def _converged_at_5():
    """A convergence check that passed at 5 steps, both legs at 0, for tests that skip solving it."""
    return techniques.converged.Convergence(5, True, "euler@10", [dict(
        steps=5, doubled=10, n_images=8, moved_mse=0.0, fastest_mse=1.0, share=0.0, independent_mse=0.0,
        fastest_independent_mse=1.0, independent_share=0.0, independent="euler@160:trailing")], "euler@160:trailing")


def test_a_key_over_the_time_budget_is_skipped_at_every_guidance(smoke_profile, monkeypatch, tmp_path):
    monkeypatch.setattr(techniques.converged, "converge", lambda *a, **k: _converged_at_5())

    plan = replace(PLAN, guidances=(7.5, 4.0), key_budget_s=60.0)

    def gate(*_args, **_kwargs):
        raise techniques.OverBudget(999.0, 99.9, 10, plan.key_budget_s, plan.n_step)

    monkeypatch.setattr(techniques, "_sequential", gate)
    t = techniques.measure(["grad:no_grad"], smoke_profile, plan=plan, scratch=tmp_path, say=lambda _: None)
    slow = t[t.key == "grad:no_grad"]
    assert list(slow.guidance) == [7.5, 4.0] and set(slow.status) == {"skipped"}
    assert slow.note.str.contains("about 999 s here").all() and slow.note.str.contains("not judged").all()
    over = techniques.overall(t[~t.key.str.startswith(techniques.REFERENCE)], plan.guidances).set_index("key")
    assert over.loc["grad:no_grad"].status == "skipped" and pd.isna(over.loc["grad:no_grad"].quality_verdict)


def test_the_plans_calibration_size_reaches_a_calibrated_key_and_its_render_key(smoke_profile, monkeypatch, tmp_path):
    """Plan.calibration_samples goes into the Context a technique is built in, and into the render-cache key of a
    calibrated key only (its IR, so its pictures, depend on it; another key's renders stay shared)."""
    monkeypatch.setattr(techniques.converged, "converge", lambda *a, **k: _converged_at_5())
    contexts, calls, context = {}, {}, technique_setup.context
    monkeypatch.setattr(technique_setup, "context", lambda *a: contexts.setdefault(len(contexts), context(*a)))

    def gate(pipe, steps, grad_mode, g, ref, plan, real, batch, aligned, pad, cache):
        calls[cache.key] = cache.call
        raise techniques.OverBudget(999.0, 99.9, 10, plan.key_budget_s, plan.n_step)

    monkeypatch.setattr(techniques, "_sequential", gate)
    plan = replace(PLAN, calibration_samples=17)
    techniques.measure(["int8:openvino-nncf-ptq", "grad:no_grad"], smoke_profile, plan=plan, scratch=tmp_path,
                       say=lambda _: None)
    assert [c.calibration_samples for c in contexts.values()] == [17, 17]
    assert calls["int8:openvino-nncf-ptq"]["calibration_samples"] == 17
    assert "calibration_samples" not in calls["grad:no_grad"]


def test_noise_control_adds_the_dose_the_same_on_both_guidance_halves():
    net = torch.nn.Conv2d(4, 4, 1)
    pipe = type("P", (), {"unet": net})()
    x = torch.randn(4, 4, 3, 3)
    clean = net(x)
    handle = controls.add_output_noise(pipe, 0.5, seed=3)
    noisy = net(x)
    handle.remove()
    added = noisy - clean
    torch.testing.assert_close(added[:2], added[2:])  # [uncond, cond] got the same draw
    assert 0.3 < float(added.std()) < 0.7 and torch.equal(net(x), clean)
    with pytest.raises(ValueError, match="dose -1"):
        controls.add_output_noise(pipe, -1)


def test_deepcache_runs_the_deep_branch_only_every_interval_calls():
    from sdperf.optimizations import feature_reuse

    pipe = storage.load()[0]
    deep, calls = [], []
    compute = pipe.unet.mid_block.forward  # counted below DeepCache's wrapper: a reused output never reaches it
    pipe.unet.mid_block.forward = lambda *a, **k: deep.append(1) or compute(*a, **k)
    pipe.unet.register_forward_pre_hook(lambda *a: calls.append(len(deep)))
    feature_reuse.apply(pipe, 3)
    domain_quality.generate(pipe, ["a small red circle at the top left on a light background"], [0], technique_setup.GUIDANCE,
                     STEPS, batch=technique_setup.RENDER_BATCH)
    timesteps = list(pipe.scheduler.timesteps)
    assert len(calls) == len(timesteps) == STEPS + 1  # PLMS evaluates its first timestep twice
    # DeepCache counts steps by the timestep's first index in the schedule: a full UNet at every third
    assert len(deep) == sum(1 for t in timesteps if timesteps.index(t) % 3 == 0) < len(calls)
    # the pattern the worker composes per-image times from is the one that ran, call by call
    ran = ["full" if after > before else "cached" for before, after in zip(calls, calls[1:] + [len(deep)])]
    assert feature_reuse.call_kinds([float(t) for t in timesteps], 3) == ran


def _render(pipe, captions: list[str]) -> np.ndarray:
    """Images as a judged technique renders them: seed 0, the seeds' guidance, RENDER_BATCH prompts per call."""
    return domain_quality.generate(pipe, captions, [0], technique_setup.GUIDANCE, STEPS, batch=technique_setup.RENDER_BATCH)


def test_token_merging_patches_the_highest_resolution_blocks_and_changes_the_picture():
    from sdperf.optimizations import token_merging

    caption = ["a large blue square at the bottom right on a dark background"]
    pipe = storage.load()[0]
    base = _render(pipe, caption)
    token_merging.apply(pipe, 0.5, seed=0)
    assert token_merging.merged_blocks(pipe.unet) > 0
    merged = _render(pipe, caption)
    again = storage.load()[0]
    token_merging.apply(again, 0.5, seed=0)
    assert not np.array_equal(base, merged)
    assert np.array_equal(merged, _render(again, caption))  # seeded: the same merges


def test_rows_round_trip_and_for_study_measures_only_what_is_missing(measured, scratch_reports, monkeypatch):
    from sdperf.measure.study import open_study

    study = open_study("smoke", notebook="12_fid_clip")
    techniques.record(study, measured)
    back = techniques.from_rows(study.recorder.current()).set_index("key")
    want = measured.set_index("key")
    for key in (controls.TWIN, controls.noise_key(4.0), "scheduler:euler@10"):
        for col in ("adherence_delta", "adherence_delta_lo", "soft_adherence_delta_hi", "latent_mse", "fid_delta_hi",
                    "kid_delta", "ssim"):
            assert back.loc[key, col] == pytest.approx(want.loc[key, col]), (key, col)
        assert back.loc[key, "quality_verdict"] == want.loc[key, "quality_verdict"]  # recomputed from the columns
        assert back.loc[key, "steps"] == want.loc[key, "steps"]
        assert back.loc[key, "cached_images"] == want.loc[key, "cached_images"]
    assert back.loc["cuda_graphs", "status"] == "not_applicable"
    conv, want_conv = techniques.convergence_from_rows(study.recorder.current()), measured.attrs["convergence"]
    assert len(conv) == len(want_conv)
    for col in ("moved_mse", "share", "independent_mse", "independent_share", "first_timestep", "last_timestep"):
        assert list(conv[col]) == pytest.approx(list(want_conv[col])), col
    former = techniques.former_from_rows(study.recorder.current())
    assert former.iloc[0].mse == pytest.approx(measured.attrs["former"].iloc[0].mse)
    said = techniques.convergence_sentence(study.recorder.current())
    assert "t 999 -> 0" in said and "euler@160:trailing" in said and "before issue 60 (dpmpp-2m@25, t 951" in said
    asked = []
    monkeypatch.setattr(techniques, "measure", lambda ks, *a, **k: asked.append(ks) or measured.iloc[:0])
    plan = techniques.Plan(**{**PLAN.__dict__})
    got = techniques.for_study(study, ["grad:no_grad", "scheduler:euler@10", "cuda_graphs"], plan,
                               say=lambda _: None)
    assert asked == [[techniques.SEEDS_SAMPLER]]  # the only key no row held: the seeds' PLMS-50
    assert set(got.key) >= {controls.TWIN, "grad:no_grad", "scheduler:euler@10"}
    with pytest.raises(ConfigError, match="unknown technique 'warp'"):
        techniques.for_study(study, ["warp"], plan)


@pytest.mark.parametrize("harm,extra,limit", [(True, True, None), (False, False, None), (True, True, 1),
                                              (True, False, 0)])
def test_ptqs_alternatives_are_judged_when_and_only_when_ptq_alone_is_over(measured, scratch_reports, monkeypatch,
                                                                           harm, extra, limit):
    """All of them, or the first `limit` in the catalog's order (the profile's reference_fallbacks), saying which
    were left out."""
    from sdperf.measure.study import open_study
    from sdperf.optimizations import quantization

    ptq = "int8:openvino-nncf-ptq"
    study = open_study("smoke", notebook="12_fid_clip")
    source = measured[measured.key == (controls.noise_key(4.0) if harm else controls.TWIN)]
    techniques.record(study, measured)
    techniques.record(study, source.assign(key=ptq, label="PTQ stand-in: the rows of a known verdict"))
    asked = []
    monkeypatch.setattr(techniques, "measure", lambda ks, *a, **k: asked.append(ks) or measured.iloc[:0])
    said = []
    got = techniques.for_study(study, [ptq], replace(PLAN, fallbacks=limit), say=said.append)
    assert got.set_index("key").loc[ptq, "quality_verdict"] == (paired.OVER if harm else paired.WITHIN)
    alternatives = list(quantization.PTQ_ALTERNATIVES)[:limit]
    assert asked == [[techniques.SEEDS_SAMPLER]] + ([[techniques.SEEDS_SAMPLER] + alternatives] if extra else [])
    left = list(quantization.PTQ_ALTERNATIVES)[len(alternatives):] if harm else []
    assert any(f"(not {', '.join(left)}: the profile's reference_fallbacks is {limit})" in s for s in said) == bool(left)
    assert got.why_judged.notna().sum() == 0  # no alternative has rows here (measure was stubbed): none is shown


def test_the_report_says_how_many_technique_images_came_from_the_render_cache(measured):
    """Controls (always rendered) and the reference's own rows do not count; a row read back wholly does."""
    rows = []
    study = type("S", (), {"recorder": type("R", (), {"add_many": lambda self, r: rows.extend(r)})()})()
    techniques.record(study, measured.assign(cached_images=[8 if k == "scheduler:euler@10" else 0
                                                            for k in measured.key]))
    table = pd.DataFrame(rows).assign(status=lambda d: d.get("status", pd.Series(dtype=object)).fillna("ok"))
    said = techniques.reuse_sentence(table)
    judged = [k for k in measured[measured.status == "ok"].key if not controls.is_control(k)
              and not k.startswith(techniques.REFERENCE)]
    assert said.startswith(f"Render cache: 8 of the {8 * len(judged)} technique images") and "1 of them wholly" in said
    assert techniques.reuse_sentence(table[table.metric != "reference_cached_images"]) is None


def test_the_time_gate_times_the_renders_not_the_build(monkeypatch):
    """A key whose pipeline takes 1,000 s to build (a calibration, an export) and 1 s a call is not over a 12 s
    budget: the build happens before the gated first batch, untimed. A cached batch builds nothing."""
    now = [0.0]
    monkeypatch.setattr(techniques.time, "perf_counter", lambda: now[0])
    built = []

    def build():
        if not built:
            now[0] += 1000.0
            built.append(True)

    def render(caps, seeds):
        build()  # as the real one: it asks for the pipeline, built once
        now[0] += 1.0
        return techniques.converged.Solve(torch.zeros(len(caps), 4, 2, 2), np.zeros((len(caps), 2, 2, 3), np.uint8))

    ref = type("R", (), {"captions": [f"c{i}" for i in range(16)], "seeds": list(range(16))})()
    plan = techniques.Plan(n_max=16, n_step=16, key_budget_s=12.0)
    got = techniques._batch(0, 16, render, build, ref, plan, 4, None)
    assert len(got) == 16 and built == [True]
    stored = type("C", (), {"get": lambda self, c, s: got.take(len(c)), "put": None})()
    built.clear()
    assert len(techniques._batch(0, 16, render, build, ref, plan, 4, stored)) == 16 and not built


def test_a_reference_that_is_not_converged_admits_nothing():
    """trust() with the convergence check's table: a guidance whose every count failed a leg is a reason, and so is
    one never checked; the controls alone no longer decide."""
    ok = pd.DataFrame([dict(guidance=7.5, steps=25, share=0.01, independent_share=0.02, chosen=True)])
    bad = pd.DataFrame([dict(guidance=7.5, steps=n, share=0.01, independent_share=0.16, chosen=False)
                        for n in (25, 50)])
    assert techniques.converged_at(ok, (7.5,)) == (True, [])
    good, why = techniques.converged_at(bad, (7.5,))
    assert not good and "not converged by 50 steps" in why[0] and "independent solve 16.0%" in why[0]
    good, why = techniques.converged_at(ok, (7.5, 4.0))
    assert not good and why == ["guidance 4: the reference's convergence was not checked"]
    verdicts = pd.DataFrame([dict(key=c.key, guidance=7.5, quality_verdict=c.expected)
                             for c in controls.defaults(PLAN.doses)])
    assert techniques.trust(verdicts, PLAN)[0] and techniques.trust(verdicts, PLAN, ok)[0]
    trusted, why = techniques.trust(verdicts, PLAN, bad)
    assert not trusted and "not converged" in why[0]
