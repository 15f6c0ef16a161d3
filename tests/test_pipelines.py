"""Offline pipelines: tokenizer equals the hub's, architectures equal the published ones, same seed same image."""
from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
import yaml

from sdperf.config import architectures
from sdperf.core import paths
from sdperf.model.generation import Workload, generate, initial_latents
from sdperf.model.pipelines import build_pipeline, build_random, component_parameters
from sdperf.config.profiles import load_profile
from sdperf.model.tokenizer import clip_tokenizer

PROMPT = "a photograph of an astronaut riding a horse"


def test_tokenizer_gives_the_hub_ids_offline():
    tok = clip_tokenizer()
    assert len(tok) == 49408
    # ids of openai/clip-vit-large-patch14's tokenizer for this prompt (bos ... eos)
    assert tok(PROMPT).input_ids == [49406, 320, 8853, 539, 550, 18376, 6765, 320, 4558, 49407]
    assert tok("", padding="max_length", max_length=77).input_ids[-1] == 49407  # SD 1.x pads with eos
    assert clip_tokenizer("!")("", padding="max_length", max_length=77).input_ids[-1] == 0  # SD 2 / SDXL pad "!"


@pytest.mark.parametrize("arch", ["sd15", "sd2-base", "sdxl"])
def test_real_architectures_have_the_published_parameter_counts(arch):
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    a = architectures.get(arch)
    with torch.device("meta"):  # shapes only: no memory, no init time
        got = {"unet": UNet2DConditionModel(**a.unet), "vae": AutoencoderKL(**a.vae),
               "text_encoder": CLIPTextModel(CLIPTextConfig(**a.text_encoder))}
        if a.text_encoder_2:
            got["text_encoder_2"] = CLIPTextModelWithProjection(CLIPTextConfig(**a.text_encoder_2))
    counts = {k: architectures.count_parameters(m) for k, m in got.items()}
    assert counts == architectures.PUBLISHED_PARAMETERS[arch]


def test_unknown_architecture_is_named():
    with pytest.raises(ValueError, match=r"unknown architecture 'sd9'.*sd15"):
        architectures.get("sd9")


def test_random_init_is_reproducible():
    a = build_random("tiny", seed=3).unet.state_dict()
    b = build_random("tiny", seed=3).unet.state_dict()
    c = build_random("tiny", seed=4).unet.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_same_seed_same_image_other_seed_other_image(tiny_pipe, smoke):
    w = Workload.from_profile(smoke, batch_size=1)
    first, again = generate(tiny_pipe, w), generate(tiny_pipe, w)
    other = generate(tiny_pipe, Workload(**{**w.__dict__, "seed": w.seed + 1}))
    assert torch.equal(first.images, again.images) and torch.equal(first.latents, again.latents)
    assert not torch.allclose(first.images, other.images)
    assert first.images.shape == (1, 3, smoke.resolution, smoke.resolution)
    assert 0.0 <= first.images.min() and first.images.max() <= 1.0


def test_initial_noise_of_an_image_does_not_depend_on_batch_size(tiny_pipe, smoke):
    one = initial_latents(tiny_pipe, Workload.from_profile(smoke, 1))
    four = initial_latents(tiny_pipe, Workload.from_profile(smoke, 4))
    assert torch.equal(one[0], four[0]) and not torch.equal(four[0], four[1])


@pytest.mark.parametrize("arch", ["tiny", "tiny-sdxl"])
def test_stage_by_stage_loop_equals_diffusers_pipeline(arch, smoke):
    pipe = build_random(arch, scheduler="euler" if arch == "tiny-sdxl" else "plms")
    w = Workload(prompt=PROMPT, batch_size=2, steps=3, guidance_scale=6.0, height=64, width=64, seed=1)
    latents = initial_latents(pipe, w)
    ours = generate(pipe, w, latents)
    ref = pipe(PROMPT, num_images_per_prompt=2, num_inference_steps=3, guidance_scale=6.0, height=64, width=64,
               latents=latents.clone(), output_type="pt").images
    torch.testing.assert_close(ours.images, ref.float(), rtol=0, atol=1e-6)


def test_save_and_load_real_weights_folder_offline(tiny_pipe, smoke, tmp_path, monkeypatch):
    folder = tmp_path / "tiny-weights"
    tiny_pipe.save_pretrained(folder)
    params = tmp_path / "params"
    params.mkdir()
    raw = yaml.safe_load((paths.REPO_ROOT / "params" / "smoke.yml").read_text())
    (params / "local.yml").write_text(yaml.safe_dump(dict(raw, weights=str(folder))))
    monkeypatch.setenv("SDPERF_PARAMS_DIR", str(params))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prof = load_profile("local")
    loaded = build_pipeline(prof)
    assert component_parameters(loaded) == component_parameters(tiny_pipe)
    w = Workload.from_profile(smoke, 1)
    assert torch.equal(generate(loaded, w).images, generate(tiny_pipe, w).images)
    shutil.rmtree(folder)


@pytest.mark.parametrize("name", ["plms", "ddim", "euler", "dpmpp-2m"])
def test_every_scheduler_runs_the_loop(name):
    pipe = build_random("tiny", scheduler=name)
    out = generate(pipe, Workload(PROMPT, 1, 3, 7.5, 64, 64, 0))
    assert torch.isfinite(out.latents).all()


def test_weights_cache_gives_the_same_networks_as_building_them(smoke, tmp_path):
    """The first process saves the seeded UNet, VAE and text encoder, a later one reads them back: bit-identical
    to a fresh build, non-persistent buffers (CLIP's position ids) included, and the same images."""
    from sdperf.model.pipelines import build_pipeline
    from sdperf.store import verified

    parts = ("unet", "vae", "text_encoder")
    fresh_pipe = build_pipeline(smoke)
    fresh = {c: {**dict(getattr(fresh_pipe, c).named_parameters()), **dict(getattr(fresh_pipe, c).named_buffers())}
             for c in parts}
    build_pipeline(smoke, weights_cache=tmp_path)
    files = sorted(tmp_path.iterdir())
    weights = [f for f in files if f.suffix == ".safetensors"]
    assert len(weights) == 3 and sorted(files) == sorted(weights + [f.with_name(f.name + verified.SEAL)
                                                                    for f in weights])  # sealed, no temporary file
    again_pipe = build_pipeline(smoke, weights_cache=tmp_path)
    for c in parts:
        again = getattr(again_pipe, c)
        tensors = {**dict(again.named_parameters()), **dict(again.named_buffers())}
        assert not any(t.is_meta for t in tensors.values())
        assert tensors.keys() == fresh[c].keys() and all(torch.equal(tensors[k], fresh[c][k]) for k in tensors)
    w = Workload(PROMPT, 1, 2, 7.5, smoke.resolution, smoke.resolution, 0)
    assert torch.equal(generate(again_pipe, w).images, generate(fresh_pipe, w).images)
    other_seed = build_pipeline(dataclasses.replace(smoke, seed=smoke.seed + 1), weights_cache=tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) == 6
    assert not torch.equal(other_seed.unet.conv_in.weight, again_pipe.unet.conv_in.weight)


def test_pipelines_from_one_weights_folder_share_a_tokenizer_that_gives_the_uncached_ids(tmp_path):
    """build_from_weights loads a local folder's tokenizer once per process (pipelines.local_tokenizers); the shared
    one must tokenize as the folder's own, and an edited tokenizer file must load again."""
    import os

    from transformers import CLIPTokenizer

    from sdperf.model.pipelines import build_from_weights

    folder = tmp_path / "reference"
    shutil.copytree(paths.REPO_ROOT / "models" / "reference", folder)
    first, second = build_from_weights(str(folder), "plms"), build_from_weights(str(folder), "euler")
    assert first.tokenizer is second.tokenizer and first.unet is not second.unet
    own = CLIPTokenizer.from_pretrained(str(folder / "tokenizer"))
    for caption in (PROMPT, "", "two red squares"):
        args = dict(padding="max_length", max_length=own.model_max_length, truncation=True)
        assert first.tokenizer(caption, **args).input_ids == own(caption, **args).input_ids
    edited = next(p for p in sorted((folder / "tokenizer").iterdir()) if p.is_file())
    os.utime(edited, ns=(edited.stat().st_atime_ns, edited.stat().st_mtime_ns + 10**9))
    assert build_from_weights(str(folder), "plms").tokenizer is not first.tokenizer
