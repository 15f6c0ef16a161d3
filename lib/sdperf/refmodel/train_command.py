"""`sdperf train-reference`: the evaluator, the autoencoder, the latents, the UNet, then the judged, hashed folder.

Each stage leaves its result in a work folder named by the recipe's digest and is skipped when it is there, so a
killed command goes on where it stopped; the output is written, manifest last, into a sibling renamed into place.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sdperf.config import architectures
from sdperf.core.errors import ConfigError
from sdperf.refmodel import domain_quality, evaluator, first_stage, loop, sdref, storage, unet_stage
from sdperf.refmodel.training_recipe import QUICK, Recipe
from sdperf.model.tokenizer import clip_tokenizer
from sdperf.training.launch import worker_env

TIMES = "times.json"


class _Clock:
    """Seconds per stage, summed over resumed runs, kept in the work folder."""

    def __init__(self, work: Path):
        self.path = work / TIMES
        self.times = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def stage(self, name: str, fn):
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start
            loop.save_json(self.path, self.times)


def work_dir(recipe: Recipe, out: Path) -> Path:
    return Path(out).parent / f".reference-work-{recipe.digest()}"


def _evaluator(recipe: Recipe, work: Path, show: bool, say):
    folder = work / storage.EVALUATOR_DIR
    if not (folder / "evaluator.json").is_file():
        trained = evaluator.train(recipe.seed, recipe.resolution, recipe.evaluator_steps, recipe.evaluator_batch,
                                  work / "evaluator-checkpoint.pt", lr=recipe.evaluator_lr,
                                  n_held_out=recipe.evaluator_held_out, show=show)
        storage.save_evaluator(trained, folder, recipe.seed, recipe.evaluator_steps)
    net, meta = storage.load_evaluator(folder)
    say(f"evaluator on {meta['n_held_out']} held-out renders: " +
        ", ".join(f"{k} {v:.4f}" for k, v in meta["accuracy"].items()))
    return net, meta


def _unet(recipe: Recipe, work: Path, show: bool) -> None:
    """torchrun, one rank per core given to it (the recipe's world size), each with one thread."""
    if (work / unet_stage.DONE).is_file():
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={recipe.world_size}",
           "-m", "sdperf.refmodel.unet_stage", "--work", str(work)] + ([] if show else ["--no-progress"])
    done = subprocess.run(cmd, env=worker_env(1))
    if done.returncode:
        raise RuntimeError(f"the UNet stage exited with {done.returncode}; run the same command again to resume "
                           f"from {work / unet_stage.CHECKPOINT}")


def _assemble(recipe: Recipe, work: Path, vae, scale: float):
    import torch

    pipe = sdref.build(recipe.seed)
    trained = torch.load(work / unet_stage.RESULT, map_location="cpu", weights_only=True)
    pipe.unet.load_state_dict(trained["unet"])
    pipe.text_encoder.load_state_dict(trained["text_encoder"])
    pipe.vae.load_state_dict(vae.state_dict())
    pipe.vae.register_to_config(scaling_factor=scale)
    return pipe


def run(recipe: Recipe, out: Path, work: Path | None = None, show: bool = True, command: str = "", say=print) -> dict:
    """Train (or resume) and write `out`; returns its manifest."""
    import torch

    out = Path(out)
    work = Path(work or work_dir(recipe, out))
    work.mkdir(parents=True, exist_ok=True)
    (work / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2, sort_keys=True))
    clock = _Clock(work)
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))

    net, meta = clock.stage("evaluator", lambda: _evaluator(recipe, work, show, say))
    if evaluator.worst(meta["accuracy"]) < recipe.evaluator_min_accuracy:
        raise RuntimeError(f"the evaluator's held-out accuracy {meta['accuracy']} is below "
                           f"{recipe.evaluator_min_accuracy} on some head; its verdicts would mean nothing "
                           "(train it longer: evaluator_steps)")
    vae, vae_curve = clock.stage("autoencoder", lambda: first_stage.train_vae(recipe, work / "vae-checkpoint.pt", show))
    check = work / "autoencoder-check.json"
    if not check.is_file():
        loop.save_json(check, clock.stage("autoencoder", lambda: first_stage.reconstruction_accuracy(
            vae, net, recipe.evaluator_held_out, recipe.resolution)))
    rec_acc = json.loads(check.read_text())
    say(f"evaluator on the autoencoder's reconstructions of {recipe.evaluator_held_out} held-out renders: " +
        ", ".join(f"{k} {v:.4f}" for k, v in rec_acc.items()))
    if rec_acc["adherence"] < recipe.vae_min_adherence:
        raise RuntimeError(f"the autoencoder's reconstructions score adherence {rec_acc['adherence']:.4f} < "
                           f"vae_min_adherence {recipe.vae_min_adherence}: no UNet could do better through this "
                           "decoder (train it longer: vae_steps)")
    if not (work / unet_stage.LATENTS).is_file():
        tokenizer = clip_tokenizer(architectures.get(sdref.ARCH).pad_token)
        data = clock.stage("latents", lambda: first_stage.encode_training_set(recipe, vae, tokenizer))
        loop.save(work / unet_stage.LATENTS, data)
    scale = float(torch.load(work / unet_stage.LATENTS, weights_only=True)["scaling_factor"])
    clock.stage("unet", lambda: _unet(recipe, work, show))

    def judged():
        real = domain_quality.Real.of(net, recipe.evaluator_held_out)
        pipe = _assemble(recipe, work, vae, scale)
        store_dir = out.with_name(out.name + ".partial")
        shutil.rmtree(store_dir, ignore_errors=True)
        storage.save_pipeline(pipe, store_dir)
        shutil.copytree(work / storage.EVALUATOR_DIR, store_dir / storage.EVALUATOR_DIR)
        from sdperf.model.pipelines import build_from_weights

        stored = build_from_weights(str(store_dir), "plms")  # judge what is stored (float16 weights as float32)
        args = (net, real, recipe.check_images, recipe.check_guidance, recipe.check_steps)
        sizes = {k: architectures.count_parameters(getattr(stored, k)) for k in ("unet", "vae", "text_encoder")}
        return store_dir, sizes, {"trained": domain_quality.judge(stored, *args), "random_init": domain_quality.judge(
            sdref.build(recipe.seed), *args)}

    store_dir, sizes, verdict = clock.stage("judge", judged)
    unet_curve = json.loads((work / unet_stage.DONE).read_text())["curve"]
    loop.save_json(store_dir / "training.json", {"evaluator": meta["curve"], "autoencoder": vae_curve,
                                                 "unet": unet_curve})
    record = dict(storage.provenance(command), recipe=recipe.to_dict(), times_s=dict(clock.times),
                  evaluator=meta["accuracy"], autoencoder_reconstructions=rec_acc, judge=verdict, scaling_factor=scale,
                  parameters=sizes)
    manifest = storage.write_manifest(store_dir, record)
    if out.exists():
        shutil.rmtree(out)
    os.replace(store_dir, out)
    t = verdict["trained"]
    say(f"reference model in {out}: adherence {t['adherence']:.3f} [{t['adherence_ci'][0]:.3f}-"
        f"{t['adherence_ci'][1]:.3f}], domain FID {t['fid']:.2f} (random init: adherence "
        f"{verdict['random_init']['adherence']:.3f}, FID {verdict['random_init']['fid']:.2f}) at guidance "
        f"{recipe.check_guidance}, {recipe.check_steps} PLMS steps; {sum(clock.times.values()) / 60:.1f} min")
    return manifest


QUICK_DIR = ".reference-quick"  # under models/, ignored by git: --quick checks code, it never makes the model


def default_out(quick: bool) -> Path:
    """models/reference/ for the real recipe; --quick's 30-second model goes beside it, never over it."""
    return storage.default_dir().parent / QUICK_DIR if quick else storage.default_dir()


def check_target(target: Path, recipe: Recipe, force: bool) -> None:
    """Refuse, before any training, to replace a model made by another recipe, unless `--force`."""
    if target.exists() and not (target / storage.MANIFEST).is_file():
        raise ConfigError(f"--out {str(target)!r} exists and is not a reference model folder; choose a new folder")
    if force or not target.exists():
        return
    try:
        made = storage.read_manifest(target).get("recipe")
    except ConfigError:
        made = None
    if made == recipe.to_dict():
        return
    ours = recipe.to_dict()
    differ = (sorted(k for k in set(ours) | set(made) if made.get(k) != ours.get(k)) if isinstance(made, dict)
              else ["its manifest records no readable recipe"])
    raise ConfigError(f"--out {str(target)!r} holds a model made by another recipe (differing: {', '.join(differ)}); "
                      "this run would replace it. Give --out a new folder, or add --force to replace it")


def main(seed: int = 0, out: str | None = None, quick: bool = False, show: bool = True, force: bool = False) -> int:
    recipe = Recipe(**dict(QUICK.to_dict(), seed=seed)) if quick else Recipe(seed=seed)
    target = Path(out) if out else default_out(quick)
    check_target(target, recipe, force)
    command = "sdperf train-reference" + (f" --seed {seed}" if seed else "") + (" --quick" if quick else "") + \
        (f" --out {out}" if out else "") + (" --force" if force else "")
    run(recipe, target, show=show, command=command)
    return 0
