"""The converged reference: solves cached by exactly what they depend on, a step count chosen by two checks against
the fastest candidate's distance (doubling, issue 31; an independent solver, issue 60), and a solve that starts at
the last training timestep."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sdperf.judge import converged

EXACT = torch.arange(4 * 2 * 2 * 2, dtype=torch.float32).reshape(4, 2, 2, 2) / 10


OFFSET = 0.01  # what a solve that starts below the noise's level keeps however many steps it takes


def _render(calls: list):
    """Solvers whose error shrinks as 1/steps^2 from the exact solution: latents = exact + err. Euler (the fastest
    candidate, and at many steps the independent solver) errs 3/steps^2; the reference's DPM-Solver++ from t=999
    (Karras sigmas) 1/steps^2; DPM-Solver++ with the model's leading spacing, which starts below t=999, as much
    plus OFFSET, which doubling its steps cannot see (both solves share the start)."""

    def render(sampler, steps, captions, seeds):
        calls.append((sampler, steps, len(captions)))
        err = (3.0 if sampler.startswith("euler") else 1.0) / steps ** 2 + (OFFSET if sampler == "dpmpp-2m" else 0)
        z = EXACT[:len(captions)] + err
        return converged.Solve(z, np.full((len(captions), 4, 4, 3), min(steps, 255), dtype=np.uint8))

    return render


def test_solves_are_cached_by_model_captions_noise_guidance_and_steps(tmp_path):
    calls = []
    s = converged.Solver(_render(calls), "model-a", 7.5, tmp_path)
    first = s.solve(["a", "b", "c"], [0, 1, 2], 20)
    again = converged.Solver(_render(calls), "model-a", 7.5, tmp_path).solve(["a", "b", "c"], [0, 1, 2], 20)
    assert len(calls) == 1 and torch.equal(first.latents, again.latents)
    assert np.array_equal(first.images, again.images)
    for other in (converged.Solver(_render(calls), "model-b", 7.5, tmp_path),  # another model's files
                  converged.Solver(_render(calls), "model-a", 4.0, tmp_path)):  # another guidance
        other.solve(["a", "b", "c"], [0, 1, 2], 20)
    s.solve(["a", "b", "c"], [0, 1, 3], 20)  # other noise
    s.solve(["a", "b", "x"], [0, 1, 2], 20)  # other captions
    s.solve(["a", "b", "c"], [0, 1, 2], 40)  # other steps
    assert len(calls) == 6
    assert not list(tmp_path.glob("*.tmp*"))  # written whole: no temp file left beside the entries
    with pytest.raises(ValueError, match="2 captions but 1 seeds"):
        s.solve(["a", "b"], [0], 20)


def test_a_long_set_is_solved_and_cached_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(converged, "CHUNK", 2)
    calls = []
    s = converged.Solver(_render(calls), "m", 7.5, tmp_path)
    s.solve(list("abc"), [0, 1, 2], 10)
    assert [c[2] for c in calls] == [2, 1] and s.made == 3
    s.solve(list("abcd"), [0, 1, 2, 3], 10)  # the first chunk is read back, the second is new (c, d)
    assert s.hits == 2 and [c[2] for c in calls] == [2, 1, 2]


def test_the_step_count_is_the_first_whose_doubling_and_independent_solve_both_stay_within_the_share():
    calls = []
    s = converged.Solver(_render(calls), "m", 7.5, None)
    got = converged.converge(s, ["a", "b"], [0, 1], ("euler", 10), ladder=(5, 10, 20, 40, 80),
                             independent=("euler:trailing", 1000))
    # moved(n) = (1/n^2 - 1/(2n)^2)^2, the candidate's (3/100 - 1/(2n)^2)^2: under 5% first at n = 20; the
    # independent solve (3e-6 from exact) is (1/n^2)^2 away, 11% of the candidate's distance at 10 and 0.7% at 20
    assert got.converged and got.steps == 20 and got.fastest == "euler@10"
    assert got.independent == "euler@1000:trailing"
    shares = [(r["share"], r["independent_share"]) for r in got.rows]
    assert max(shares[-1]) < converged.SHARE <= shares[-2][0] and shares[1][1] > converged.SHARE
    assert [r["steps"] for r in got.rows] == [5, 10, 20]
    assert "doubling to 40 steps" in got.text() and "euler@1000:trailing" in got.text()
    assert got.former["key"] == "dpmpp-2m@25" and got.former["share"] > converged.SHARE  # offset: over
    short = converged.converge(s, ["a", "b"], [0, 1], ("euler", 10), ladder=(5,), independent=("euler:trailing", 1000))
    assert not short.converged and "NOT converged by 5 steps" in short.text()


def test_a_reference_offset_by_its_start_passes_doubling_and_fails_the_independent_leg():
    """Leading spacing starts DPM-Solver++ below the noise's level: doubling its steps moves it as little as the
    reference's (the offset is shared), and only the independent solve sees that it converges elsewhere."""
    calls = []
    s = converged.Solver(_render(calls), "m", 7.5, None)
    got = converged.converge(s, ["a", "b"], [0, 1], ("euler", 10), ladder=(5, 10, 20, 40, 80),
                             independent=("euler:trailing", 1000), sampler="dpmpp-2m")
    assert not got.converged and got.steps == 80
    assert all(r["independent_share"] > converged.SHARE for r in got.rows)
    assert got.rows[-1]["share"] < converged.SHARE  # the doubling leg alone would have called it converged
    assert "NOT converged" in got.text()


def test_the_reference_starts_at_the_last_training_timestep_at_every_count():
    """The converged solve and its independent check start where the noise is (t=999 for the reference model's
    1000 training timesteps) at every count either profile may try; the model's own leading spacing does not."""
    import json

    from sdperf.config.profiles import load_profile
    from sdperf.model.pipelines import timestep_span
    from sdperf.refmodel import storage

    config = json.loads((storage.default_dir() / "scheduler" / "scheduler_config.json").read_text())
    last = config["num_train_timesteps"] - 1
    counts = set(converged.LADDER) | {2 * n for n in converged.LADDER}
    for name in ("smoke", "cpu", "cpu-full"):
        q = load_profile(name).quality
        counts |= set(q["reference_convergence_steps"]) | {2 * n for n in q["reference_convergence_steps"]}
        assert timestep_span(converged.INDEPENDENT, q["reference_independent_steps"], config)[0] == last
    for n in sorted(counts):
        first, end = timestep_span(converged.SOLVER, n, config)
        assert (first, end) == (last, 0), (n, first, end)  # Karras's levels: from the noise's level to the image's
    assert timestep_span(converged.FORMER[0], converged.FORMER[1], config)[0] < last  # the model's spacing


def test_latent_mse_is_per_image_and_refuses_mismatched_sets():
    a = torch.zeros(3, 2, 2, 2)
    b = a.clone()
    b[1] += 2.0
    assert list(converged.latent_mse(a, b)) == [0.0, 4.0, 0.0]
    with pytest.raises(ValueError, match="equal shapes"):
        converged.latent_mse(a, b[:2])
    assert converged.model_hash({"files": {"x": "1"}}) != converged.model_hash({"files": {"x": "2"}})
