"""`sdperf train-reference` through its own code at a few steps: bad recipes fail first, checkpoints resume into
the same steps, a SIGKILLed UNet stage ends with the weights of an uninterrupted one, and the output folder is
hashed, verified and loadable as a diffusers pipeline."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from sdperf.core.errors import ConfigError
from sdperf.refmodel import domain_quality, first_stage, loop, sdref, storage, train_command, unet_stage
from sdperf.refmodel.training_recipe import QUICK, Recipe


@pytest.mark.parametrize("change, named", [
    ({"unet_steps": 0}, "unet_steps=0"), ({"unet_lr": float("nan")}, "unet_lr=nan"),
    ({"caption_dropout": 1.5}, "caption_dropout=1.5"), ({"resolution": 40}, "resolution=40"),
    ({"unet_batch": 7, "world_size": 2}, "unet_batch=7"), ({"seed": -1}, "seed=-1"),
])
def test_a_bad_recipe_names_the_value_and_the_choices(change, named):
    with pytest.raises(ConfigError, match="choose") as err:
        Recipe(**change)
    assert named in str(err.value)


def test_unknown_recipe_keys_are_refused():
    with pytest.raises(ConfigError, match="wamrup"):
        Recipe.from_dict({"wamrup": 3})


def _toy(tmp_path, steps, stop_at=None):
    """A linear model trained by loop.run on noise drawn from a checkpointed generator."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)

    def step(s):
        x = torch.randn(8, 4, generator=g) + s
        value = net(x).pow(2).mean()
        opt.zero_grad()
        value.backward()
        opt.step()
        return float(value.detach())

    def stop(done):
        if stop_at is not None and done >= stop_at:
            raise KeyboardInterrupt

    parts = {"net": net, "optimizer": opt, "noise": loop.GeneratorState(g)}
    curve = loop.run(tmp_path / "ckpt.pt", parts, steps, step, every=5, show=False, on_save=stop)
    return net, curve


def test_an_interrupted_loop_resumes_into_the_same_steps(tmp_path):
    straight, curve = _toy(tmp_path / "a", 20)
    with pytest.raises(KeyboardInterrupt):
        _toy(tmp_path / "b", 20, stop_at=10)
    assert not loop.finished(tmp_path / "b" / "ckpt.pt", 20) and loop.load(tmp_path / "b" / "ckpt.pt")["step"] == 10
    resumed, resumed_curve = _toy(tmp_path / "b", 20)
    torch.testing.assert_close(resumed.weight, straight.weight, rtol=0, atol=0)
    assert resumed_curve == curve and [c["step"] for c in curve] == [10, 20]


@pytest.fixture(scope="module")
def unet_work(tmp_path_factory):
    """A work folder holding what the UNet stage reads: the recipe and latents from a random-init VAE."""
    work = tmp_path_factory.mktemp("work")
    recipe = dataclasses.replace(QUICK, unet_steps=6, checkpoint_every=2, world_size=1)
    pipe = sdref.build(recipe.seed)
    loop.save(work / unet_stage.LATENTS, first_stage.encode_training_set(recipe, pipe.vae, pipe.tokenizer))
    (work / "recipe.json").write_text(json.dumps(recipe.to_dict()))
    return work


def _stage(work, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    return subprocess.run([sys.executable, "-m", "sdperf.refmodel.unet_stage", "--work", str(work), "--no-progress",
                           *extra], env=env, capture_output=True, text=True, timeout=600)


def test_a_killed_unet_stage_resumes_to_the_weights_of_an_uninterrupted_one(unet_work, tmp_path):
    other = tmp_path / "straight"
    other.mkdir()
    for name in ("recipe.json", unet_stage.LATENTS):
        (other / name).write_bytes((unet_work / name).read_bytes())
    unet_stage.train(other, 0, 1, show=False)  # the uninterrupted run in this process: one thread, as the stages
    killed = _stage(unet_work, "--kill-after-save", "4")
    assert killed.returncode == -9 and not (unet_work / unet_stage.DONE).exists()
    assert loop.load(unet_work / unet_stage.CHECKPOINT)["step"] == 4
    resumed = _stage(unet_work)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = torch.load(other / unet_stage.RESULT, weights_only=True)
    b = torch.load(unet_work / unet_stage.RESULT, weights_only=True)
    for part in ("unet", "text_encoder"):
        assert a[part].keys() == b[part].keys()
        for k in a[part]:
            torch.testing.assert_close(b[part][k], a[part][k], rtol=0, atol=0, msg=f"{part}.{k}")
    start = sdref.build(0)
    assert not torch.equal(a["unet"]["conv_in.weight"], start.unet.conv_in.weight)  # it trained


@pytest.fixture(scope="module")
def quick_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "reference"
    manifest = train_command.run(QUICK, out, show=False, command="sdperf train-reference --quick", say=lambda *_: None)
    return out, manifest


def test_the_quick_run_writes_a_hashed_diffusers_folder_with_its_provenance(quick_model):
    out, manifest = quick_model
    assert (out / "model_index.json").is_file() and (out / "evaluator" / "evaluator.safetensors").is_file()
    assert "unet/diffusion_pytorch_model.safetensors" in manifest["files"]
    assert manifest["command"] == "sdperf train-reference --quick" and manifest["commit"]
    assert manifest["recipe"] == QUICK.to_dict()
    assert set(manifest["times_s"]) >= {"evaluator", "autoencoder", "latents", "unet", "judge"}
    assert 0 <= manifest["autoencoder_reconstructions"]["adherence"] <= 1
    assert manifest["judge"]["trained"]["n"] == QUICK.check_images
    assert 0 <= manifest["judge"]["trained"]["adherence"] <= 1
    assert storage.verify(out) == manifest
    assert not list(out.parent.glob("*.partial"))
    curves = json.loads((out / "training.json").read_text())
    assert [c["step"] for c in curves["unet"]][-1] == QUICK.unet_steps


def test_the_stored_model_loads_as_a_pipeline_and_generates_domain_images(quick_model):
    out, _ = quick_model
    pipe, net, manifest = storage.load(out)
    assert pipe.vae.config.scaling_factor == pytest.approx(manifest["scaling_factor"])
    images = domain_quality.generate(pipe, ["a small red circle at the top left on a dark background"] * 2, [0, 1], 7.5, 3, batch=2)
    assert images.shape == (2, 32, 32, 3) and images.dtype == np.uint8
    assert not np.array_equal(images[0], images[1])  # two seeds, two images


def test_a_changed_or_missing_file_is_named_by_verify(quick_model, tmp_path):
    import shutil

    out, _ = quick_model
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with open(copy / "vae" / "diffusion_pytorch_model.safetensors", "r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 1]))
    (copy / "evaluator" / "evaluator.json").unlink()
    with pytest.raises(ConfigError, match="vae/diffusion_pytorch_model.safetensors") as err:
        storage.verify(copy)
    assert "evaluator/evaluator.json" in str(err.value)
    with pytest.raises(ConfigError, match="train-reference"):
        storage.verify(tmp_path / "nothing")


def test_paired_delta_sees_a_regression_that_unpaired_means_would_call_noise():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.3, 1.0, 300)  # prompts differ a lot from each other
    worse = base - 0.02 + rng.normal(0, 0.005, 300)  # every prompt a little worse
    mean, lo, hi = domain_quality.paired_delta(worse, base)
    assert hi < 0 and lo < mean < hi
    _, lo_u, hi_u = domain_quality.mean_interval(base)
    assert lo_u < worse.mean() < hi_u  # unpaired, the variant's mean sits inside the baseline's interval


def test_the_command_refuses_a_bad_seed_and_a_foreign_output_folder_before_training(tmp_path, capsys):
    from sdperf import cli

    assert cli.main(["train-reference", "--seed", "-1", "--out", str(tmp_path / "m")]) == 2
    assert "seed=-1" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert cli.main(["train-reference", "--out", str(tmp_path / "taken")]) == 2
    assert "not a reference model folder" in capsys.readouterr().err
    assert not list(tmp_path.glob(".reference-work-*"))  # nothing was started


def test_the_guidance_curve_gives_intervals_a_verdict_and_figures(quick_model):
    from sdperf.judge import guidance_curve

    out, manifest = quick_model
    pipe, net, _ = storage.load(out)
    real = domain_quality.Real.of(net, manifest["recipe"]["evaluator_held_out"])
    table, kept = guidance_curve.run(pipe, net, real, [1.5, 4.0], n=6, steps=3, keep=2)
    assert list(table.guidance) == [1.5, 4.0] and (table.n_images == 6).all()
    assert ((table.adherence_lo <= table.adherence) & (table.adherence <= table.adherence_hi)).all()
    assert ((table.fid_lo <= table.fid_hi) & (table.domain_fid >= 0)).all()
    assert "guidance 1.5" in guidance_curve.verdict(table) and "Domain FID is lowest" in guidance_curve.verdict(table)
    assert len(guidance_curve.plot(table, "t").axes) == 3
    assert len(guidance_curve.grid(kept, ["a", "b"]).axes) == 4
    # a later run reads the same solves back from the cache, says so, and states no time it did not measure
    cache = out.parent / "solves"
    first, _ = guidance_curve.run(pipe, net, real, [1.5], n=6, steps=3, cache=cache, model_hash="m")
    again, _ = guidance_curve.run(pipe, net, real, [1.5], n=6, steps=3, cache=cache, model_hash="m")
    assert first.from_cache.tolist() == [0] and again.from_cache.tolist() == [6]
    assert again.adherence.tolist() == first.adherence.tolist() and again.s_per_image.isna().all()
    assert first.adherence.tolist() == table.adherence.iloc[:1].tolist()  # the cache changes no figure


def test_an_autoencoder_below_its_gate_stops_the_run_before_the_unet_stage(tmp_path):
    recipe = dataclasses.replace(QUICK, vae_min_adherence=1.0)  # a few steps cannot reconstruct every claim
    with pytest.raises(RuntimeError, match="vae_steps"):
        train_command.run(recipe, tmp_path / "reference", work=tmp_path / "work", show=False, say=lambda *_: None)
    assert (tmp_path / "work" / "autoencoder-check.json").is_file()
    assert not (tmp_path / "work" / unet_stage.LATENTS).exists() and not (tmp_path / "reference").exists()
