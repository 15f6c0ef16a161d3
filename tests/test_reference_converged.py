"""The converged reference: solves cached by exactly what they depend on, and a step count chosen by the doubling
check against the fastest candidate's distance (issue 31)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sdperf.reference import converged

EXACT = torch.arange(4 * 2 * 2 * 2, dtype=torch.float32).reshape(4, 2, 2, 2) / 10


def _render(calls: list):
    """A solver whose error shrinks as 1/steps^2 (a second-order method): latents = exact + 1/steps^2."""

    def render(sampler, steps, captions, seeds):
        calls.append((sampler, steps, len(captions)))
        err = (3.0 if sampler == "euler" else 1.0) / steps ** 2
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


def test_the_step_count_is_the_first_whose_doubling_moves_less_than_the_share():
    calls = []
    s = converged.Solver(_render(calls), "m", 7.5, None)
    got = converged.converge(s, ["a", "b"], [0, 1], ("euler", 10), ladder=(5, 10, 20, 40, 80))
    # moved(n) = (1/n^2 - 1/(2n)^2)^2, the candidate's (3/100 - 1/(2n)^2)^2: under 5% first at n = 20
    assert got.converged and got.steps == 20 and got.fastest == "euler@10"
    moved = [r["share"] for r in got.rows]
    assert moved[-1] < converged.SHARE <= moved[-2]
    assert [r["steps"] for r in got.rows] == [5, 10, 20] and "20 -> 40 steps" in got.text()
    short = converged.converge(s, ["a", "b"], [0, 1], ("euler", 10), ladder=(5,))
    assert not short.converged and "not converged by 5 steps" in short.text()


def test_latent_mse_is_per_image_and_refuses_mismatched_sets():
    a = torch.zeros(3, 2, 2, 2)
    b = a.clone()
    b[1] += 2.0
    assert list(converged.latent_mse(a, b)) == [0.0, 4.0, 0.0]
    with pytest.raises(ValueError, match="equal shapes"):
        converged.latent_mse(a, b[:2])
    assert converged.model_hash({"files": {"x": "1"}}) != converged.model_hash({"files": {"x": "2"}})
