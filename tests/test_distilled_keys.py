"""Distilled students (distill:lcm@<n>, distill:guidance), the tiny decoder and the guidance cuts on the smoke
profile's random-init pipeline: catalog keys and refusals, the loop's UNet calls, and the loop against diffusers."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from sdperf.core.errors import ConfigError
from sdperf.imagegen.render import render_with_latents
from sdperf.measure.worker import loop_timesteps
from sdperf.model import generation as gen
from sdperf.model.generation import Workload, generate, initial_latents
from sdperf.model.pipelines import build_pipeline
from sdperf.optimizations import catalog, guidance_cuts
from sdperf.optimizations.catalog import DECODER, DISTILLED, GUIDANCE, Context, Stack

NEW_KEYS = {"distill:lcm@4": DISTILLED, "distill:lcm@3": DISTILLED, "distill:guidance": DISTILLED,
            "decoder:tiny": DECODER, "guidance:cutoff@0.5": GUIDANCE, "guidance:interval@0.28-5.42": GUIDANCE}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def base(smoke):
    return build_pipeline(smoke)


@pytest.fixture
def fresh(base):
    """A pipeline of its own: the students replace (and on random init, edit in place) the pipeline's networks."""
    return copy.deepcopy(base)


def applied(key, pipe, profile):
    return Stack.of(key).apply(pipe, Context(profile))


@pytest.mark.parametrize("key", NEW_KEYS)
def test_each_new_key_builds_lossy_with_a_transfer_statement_in_its_family(key):
    tech = catalog.get(key)
    assert tech.key == key and tech.family == NEW_KEYS[key] and tech.changes_output
    assert tech.transfer is not None and all(tech.transfer)
    assert [t.key for t in Stack.of(key).techniques] == [key] and Stack.of(key).changes_output


def test_canonical_keys_and_the_lcm_student_owns_its_sampler():
    assert {"distill:lcm@1", "distill:lcm@2", "distill:lcm@4", "distill:lcm@8", "distill:guidance", "decoder:tiny",
            "guidance:cutoff@0.5", "guidance:interval@0.28-5.42"} <= set(catalog.keys())
    lcm = catalog.get("distill:lcm@4")
    assert (lcm.steps, lcm.sampler, lcm.owns_sampler) == (4, "lcm", True)
    assert catalog.get("distill:lcm@3").steps == 3  # parametric beyond the canonical counts
    assert not catalog.get("distill:guidance").owns_sampler and catalog.get("distill:guidance").sampler is None
    assert catalog.get("guidance:cutoff@0.5").call_kinds is not None


@pytest.mark.parametrize("key, bad, forms", [
    ("distill:lcm@0", "lcm@0", ("distill:lcm@<steps>", "distill:guidance")),
    ("distill:foo", "foo", ("distill:lcm@<steps>", "distill:guidance")),
    ("guidance:cutoff@1.5", "cutoff@1.5", ("guidance:cutoff@<share>", "guidance:interval@<lo>-<hi>")),
    ("guidance:interval@5-1", "interval@5-1", ("guidance:cutoff@<share>", "guidance:interval@<lo>-<hi>")),
    ("guidance:bogus@1", "bogus@1", ("guidance:cutoff@<share>", "guidance:interval@<lo>-<hi>"))])
def test_a_bad_argument_names_the_value_and_the_valid_forms(key, bad, forms):
    with pytest.raises(ConfigError) as err:
        catalog.get(key)
    assert repr(bad) in str(err.value) and all(f in str(err.value) for f in forms)


@pytest.mark.parametrize("stack", ["distill:lcm@4+scheduler:euler@10", "distill:guidance+guidance:cutoff@0.5",
                                   "decoder:tiny+stages:openvino-int8w", "distill:lcm@4+engine:openvino-f32"])
def test_stacks_that_cannot_hold_together_are_refused_naming_both_keys(stack):
    with pytest.raises(ConfigError) as err:
        Stack.of(stack)
    assert all(k in str(err.value) for k in stack.split("+"))


def test_stacks_that_hold_together():
    euler = Stack.of("distill:guidance+scheduler:euler@10")
    assert (euler.steps, euler.sampler) == (10, "euler")
    both = Stack.of("distill:lcm@2+decoder:tiny+precision:bfloat16")
    assert (both.steps, both.sampler, both.dtype, both.loop_only) == (2, "lcm", "bfloat16", False)
    cut = Stack.of("guidance:cutoff@0.5+scheduler:euler@10")
    assert cut.steps == 10 and cut.call_kinds is not None and cut.loop_only


def _unet_calls(pipe, workload, latents=None):
    """(batch size, timestep_cond or None) of every UNet call of one generation."""
    calls = []
    hook = pipe.unet.register_forward_pre_hook(
        lambda m, a, kw: calls.append((a[0].shape[0], kw.get("timestep_cond"))), with_kwargs=True)
    try:
        out = generate(pipe, workload, latents)
    finally:
        hook.remove()
    return calls, out


def test_the_baseline_runs_cfg_at_twice_the_prompt_batch(smoke, base):
    workload = Workload.from_profile(smoke, batch_size=2, steps=4)
    calls, _ = _unet_calls(base, workload)
    assert [b for b, _ in calls] == [4] * len(loop_timesteps(base, 4)) and all(c is None for _, c in calls)
    assert gen.uses_cfg(base, workload) and not gen.guidance_embedded(base.unet)
    assert gen.guidance_kwargs(base, workload, 2, "cpu", torch.float32) == {}


@pytest.mark.parametrize("key, sampler", [("distill:lcm@4", "LCMScheduler"), ("distill:guidance", "PNDMScheduler")])
def test_a_distilled_student_calls_the_unet_once_per_step_at_the_prompt_batch(smoke, fresh, key, sampler):
    pipe = applied(key, fresh, smoke)
    assert pipe.unet.config.time_cond_proj_dim == 256 and type(pipe.scheduler).__name__ == sampler
    workload = Workload.from_profile(smoke, batch_size=2, steps=4)
    assert gen.guidance_embedded(pipe.unet) and not gen.uses_cfg(pipe, workload)
    calls, out = _unet_calls(pipe, workload)
    assert [b for b, _ in calls] == [2] * len(loop_timesteps(pipe, 4))
    expected = pipe.get_guidance_scale_embedding(torch.full((2,), smoke.guidance_scale - 1.0), embedding_dim=256)
    assert all(c is not None and torch.equal(c, expected) for _, c in calls)
    assert torch.isfinite(out.images).all()


@pytest.mark.parametrize("key", ["guidance:cutoff@0.5", "guidance:interval@0.28-5.42"])
def test_a_guidance_cut_halves_the_batch_on_exactly_its_unguided_steps(smoke, fresh, key):
    pipe = applied(key, fresh, smoke)
    kinds = Stack.of(key).call_kinds(loop_timesteps(pipe, 6))
    assert set(kinds) == {guidance_cuts.GUIDED, guidance_cuts.UNGUIDED}  # both branches run at 6 PLMS steps
    calls, _ = _unet_calls(pipe, Workload.from_profile(smoke, batch_size=2, steps=6))
    assert [b for b, _ in calls] == [4 if k == guidance_cuts.GUIDED else 2 for k in kinds]


def test_guided_decision_rules():
    assert [guidance_cuts.guided(("cutoff", 0.5), i, 6, 500) for i in range(6)] == [True] * 4 + [False] * 2
    assert guidance_cuts.sigma(999) > 5.42 > guidance_cuts.sigma(751) > 0.28 > guidance_cuts.sigma(1)
    assert guidance_cuts.call_kinds(("interval", 0.28, 5.42), [999, 751, 1]) == ["unguided", "guided", "unguided"]


def test_a_cut_that_guides_every_step_is_the_baseline_bit_for_bit(smoke, base, fresh):
    workload = Workload.from_profile(smoke, steps=4)
    assert int(len(loop_timesteps(base, 4)) * 0.9) == len(loop_timesteps(base, 4)) - 1  # the last step is guided too
    ref = generate(base, workload)
    out = generate(applied("guidance:cutoff@0.9", fresh, smoke), workload)
    assert torch.equal(out.images, ref.images) and torch.equal(out.latents, ref.latents)


def test_a_cut_that_guides_no_step_is_the_unguided_generation_bit_for_bit(smoke, base):
    # no sigma of SD's schedule lies in (0, 0.001] (the least, at t=0, is about 0.03): every step unguided, which is
    # what guidance scale 1.0 computes (the UNet on the prompt's embedding alone, eps = cond)
    workload = Workload.from_profile(smoke, steps=4)
    latents = initial_latents(base, workload)
    unguided = generate(base, replace(workload, guidance_scale=1.0), latents)
    guided = generate(base, workload, latents)
    none = applied("guidance:interval@0-0.001", copy.deepcopy(base), smoke)
    out = generate(none, workload, latents)
    assert torch.equal(out.latents, unguided.latents) and torch.equal(out.images, unguided.images)
    first = generate(applied("guidance:cutoff@0", copy.deepcopy(base), smoke), workload, latents)  # step 0 guided
    assert not torch.equal(first.latents, unguided.latents) and not torch.equal(first.latents, guided.latents)


def test_the_lcm_loop_matches_diffusers_pipeline_call(smoke, fresh):
    # diffusers' LCM path hands `generator` to LCMScheduler.step, whose randn_tensor draws image i's fresh noise from
    # generator[i] of a list: the list noise_generators builds from the same initial noise reproduces sdperf's draws
    pipe = applied("distill:lcm@2", fresh, smoke)
    workload = Workload.from_profile(smoke, batch_size=2, steps=2)
    latents = initial_latents(pipe, workload)
    ours = generate(pipe, workload, latents, decode_images=False).latents
    with torch.no_grad():
        theirs = pipe(workload.prompt, height=workload.height, width=workload.width, num_inference_steps=2,
                      guidance_scale=workload.guidance_scale, num_images_per_prompt=2, latents=latents.clone(),
                      generator=gen.noise_generators(latents), output_type="latent").images
    assert torch.allclose(ours, theirs.float(), rtol=1e-5, atol=1e-6)


def test_noise_generators_depend_on_each_image_alone():
    a, b = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    pair, alone = gen.noise_generators(torch.stack([a, b])), gen.noise_generators(b[None])
    draw = lambda g: torch.randn(16, generator=g)  # noqa: E731
    first, second, single = draw(pair[0]), draw(pair[1]), draw(alone[0])
    assert torch.equal(second, single) and not torch.equal(first, second)


def test_lcm_images_do_not_depend_on_their_batch(smoke, fresh):
    pipe = applied("distill:lcm@4", fresh, smoke)
    w0 = Workload.from_profile(smoke, steps=4)
    w1 = replace(w0, seed=w0.seed + 17)
    batch, batch_images = render_with_latents(pipe, [w0, w1])
    for i, w in enumerate((w0, w1)):
        alone, alone_images = render_with_latents(pipe, [w])
        # float sums differ with the batch (~2e-5 on latents of size ~80); a draw from a shared generator differs by ~20
        assert torch.allclose(batch[i], alone[0], rtol=1e-5, atol=1e-4), i
        assert abs(batch_images[i].astype(int) - alone_images[0].astype(int)).max() <= 1, i


def test_the_tiny_decoder_replaces_the_vae_and_its_decode_is_timed(smoke, fresh):
    from diffusers import AutoencoderTiny

    levels = len(fresh.vae.config.block_out_channels)
    pipe = applied("decoder:tiny", fresh, smoke)
    assert isinstance(pipe.vae, AutoencoderTiny) and not catalog.get("decoder:tiny").loop_only
    assert len(pipe.vae.config.decoder_block_out_channels) == levels
    assert type(pipe.unet).__name__ == "UNet2DConditionModel" and pipe.unet.config.time_cond_proj_dim is None
    out = generate(pipe, Workload.from_profile(smoke, batch_size=2))
    assert out.images.shape == (2, 3, smoke.resolution, smoke.resolution) and torch.isfinite(out.images).all()
    assert not Stack.of("decoder:tiny").loop_only and not Stack.of("distill:lcm@2+decoder:tiny").loop_only
