"""DeepCache and token merging on the study's own SD-architecture smoke pipeline: availability reasons, bad keys,
apply, and a generation through the study's one generation path."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from sdperf.core.errors import ConfigError
from sdperf.model.generation import generate, initial_latents
from sdperf.optimizations import catalog, feature_reuse, token_merging
from sdperf.optimizations.catalog import Context, Stack
from sdperf.model.pipelines import build_pipeline


@pytest.mark.parametrize("key, package", [("deepcache:3", "DeepCache"), ("tome:0.5", "tomesd")])
def test_a_missing_package_is_a_reason_not_an_error(smoke, monkeypatch, key, package):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    ok, reason = catalog.get(key).availability(Context(smoke))
    assert not ok and package in reason and "not installed" in reason
    monkeypatch.undo()
    assert catalog.get(key).availability(Context(smoke))[0]


@pytest.mark.parametrize("key, valid", [("deepcache:1", ">= 2"), ("deepcache:x", "integer"), ("tome:0.9", "0.75"),
                                        ("tome:much", "number")])
def test_a_bad_parameter_names_the_valid_range(key, valid):
    with pytest.raises(ConfigError, match=valid):
        catalog.get(key)


@pytest.mark.parametrize("key", ["deepcache:2", "tome:0.5"])
def test_each_applies_to_the_smoke_pipeline_and_generates_through_the_study_path(smoke, key):
    base = build_pipeline(smoke)
    workload = Context(smoke).workload(steps=4)
    latents = initial_latents(base, workload)
    ref = generate(base, workload, latents)
    ctx = Context(smoke)
    pipe = Stack.of(key).apply(build_pipeline(smoke), ctx)
    calls = []
    pipe.unet.register_forward_pre_hook(lambda *a: calls.append(1))
    out = generate(pipe, workload, latents)
    assert out.latents.shape == ref.latents.shape and torch.isfinite(out.latents).all()
    assert len(calls) == 5  # PLMS at 4 steps: 5 UNet calls, whatever each call skips or merges
    if key.startswith("deepcache"):
        assert ctx.facts["deepcache_interval"] == 2 and pipe._sdperf_deepcache is not None
        assert not torch.equal(out.latents, ref.latents)  # cached deep features: another trajectory
    else:
        assert ctx.facts["tome_blocks_patched"] == token_merging.merged_blocks(pipe.unet) > 0


def test_neither_can_follow_an_executor_that_replaced_the_unet(smoke):
    pipe = build_pipeline(smoke)
    pipe.unet = torch.nn.Identity()
    with pytest.raises(TypeError, match="cannot follow an executor"):
        feature_reuse.apply(pipe, 3)
    with pytest.raises(TypeError, match="cannot follow an executor"):
        token_merging.apply(pipe, 0.5)
