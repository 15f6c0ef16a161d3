"""`sdperf doctor`: every catalog rung with a verdict and a reason, for a GPU profile on this CPU machine too."""
from __future__ import annotations

import dataclasses
import time

from sdperf import doctor
from sdperf.cli import main
from sdperf.optimizations import catalog
from sdperf.profiles import load_profile


def test_every_rung_has_a_verdict_and_a_reason_for_a_gpu_profile_here(capsys):
    start = time.perf_counter()
    assert main(["doctor", "--profile", "sd15-a10g"]) == 0
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out
    for key in catalog.keys():
        assert key in out, key
    rows = {r["rung"]: r for r in doctor.rungs(load_profile("sd15-a10g", check_runtime=False))}
    assert set(rows) == set(catalog.keys())
    assert all(r["reason"] for r in rows.values())
    import torch

    if not torch.cuda.is_available():  # on this CPU machine the GPU rungs say why not, in their own words
        assert rows["cuda_graphs"]["verdict"] == doctor.WONT_RUN and "cuda" in rows["cuda_graphs"]["reason"].lower()
        assert "device 'cuda' is not available on this machine" in out
    assert elapsed < 60, f"took {elapsed:.0f}s"


def test_the_verdict_follows_the_techniques_own_check(monkeypatch):
    profile = load_profile("smoke", check_runtime=False)
    key = catalog.keys()[0]
    tech = catalog.get(key)
    refused = dataclasses.replace(tech, availability=lambda ctx: (False, "a reason from the check"))
    monkeypatch.setattr(catalog, "get", lambda k: refused)
    row = next(r for r in doctor.rungs(profile) if r["rung"] == key)
    assert (row["verdict"], row["reason"]) == (doctor.WONT_RUN, "a reason from the check")
