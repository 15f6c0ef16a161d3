"""`sdperf train-student KIND`: a student of the committed reference model, trained, judged and stored with a manifest.

The work folder is named by the recipe's digest and the teacher's weights, so a killed command resumes where it
saved; the output is written, manifest last, into a sibling renamed into place, and a folder another recipe made
is replaced only with `--force`. The students live beside the teacher: models/lcm-student/ (unet/),
models/guidance-student/ (unet/) and models/tiny-decoder/ (decoder/), each loaded onto the teacher's pipeline.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch

from sdperf.core.errors import ConfigError
from sdperf.refmodel import distillation, domain_quality, loop, storage
from sdperf.refmodel import student_recipe as recipes
from sdperf.refmodel.student_recipe import StudentRecipe

DATA, CHECKPOINT, TIMES = "data.pt", "checkpoint.pt", "times.json"
PART = {"lcm": "unet", "guidance": "unet", "tiny-decoder": "decoder"}  # the subfolder a kind stores
SAMPLER = {"lcm": "lcm", "guidance": "euler", "tiny-decoder": "plms"}  # what it is judged with in its manifest


def default_dir(kind: str, quick: bool = False) -> Path:
    name = recipes.FOLDERS[kind]
    return storage.default_dir().parent / (f".{name}-quick" if quick else name)


def _teacher_digest(manifest: dict) -> str:
    files = manifest["files"]
    return ",".join(files[k] for k in sorted(files) if k.startswith(("unet/", "vae/", "text_encoder/")))


def work_dir(recipe: StudentRecipe, out: Path, teacher: str) -> Path:
    return Path(out).parent / f".{recipe.folder}-work-{recipe.digest(teacher)}"


def _train(recipe: StudentRecipe, teacher, data: dict, work: Path, show: bool):
    """(trained module in eval mode, curve): the student of `recipe.kind`, resumed from work/CHECKPOINT."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(recipe.seed)
    alphas = distillation_alphas(teacher)
    frozen = teacher.unet.eval().requires_grad_(False)
    if recipe.kind == "tiny-decoder":
        levels = len(teacher.vae.config.block_out_channels)
        net = distillation.tiny_decoder(recipe.decoder_width, levels)
        net.encoder.requires_grad_(False)  # txt2img never encodes: only the decoder is trained
        trained = net.decoder
    else:
        net = distillation.student_unet(frozen, recipe.guidance_dim)
        trained = net
    net.train()
    opt = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=recipe.lr, weight_decay=0.0)
    sched = loop.cosine_with_warmup(opt, recipe.warmup, recipe.steps)
    parts = {"model": net, "optimizer": opt, "schedule": sched}
    target = None
    if recipe.kind == "lcm":
        target = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(recipe.target_ema))
        target.module.eval().requires_grad_(False)
        parts["target"] = target

    def step(s: int) -> float:
        if recipe.kind == "lcm":
            loss = distillation.consistency_loss(net, target.module, frozen, alphas, data, recipe, s)
        elif recipe.kind == "guidance":
            loss = distillation.guidance_loss(net, frozen, alphas, data, recipe, s)
        else:
            loss = distillation.decoder_loss(net, teacher.vae, data, recipe, s)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained.parameters(), 1.0)
        opt.step()
        sched.step()
        if target is not None:
            target.update_parameters(net)
        return float(loss.detach())

    curve = loop.run(work / CHECKPOINT, parts, recipe.steps, step, every=recipe.checkpoint_every, desc=recipe.kind,
                     show=show)
    # LCM samples with the EMA target, as diffusers' consistency-distillation script saves target_unet
    final = target.module if target is not None else net
    return final.eval().requires_grad_(False), curve


def distillation_alphas(teacher) -> torch.Tensor:
    from sdperf.refmodel import sdref

    return sdref.noise_scheduler().alphas_cumprod.float()


def place(pipe, kind: str, module, sampler: str | None = None):
    """The teacher's pipeline with the student in its place (UNet or VAE) and, for a UNet student, `sampler`."""
    from sdperf.optimizations.fewer_steps import scheduler_config
    from sdperf.model.pipelines import make_scheduler

    if PART[kind] == "unet":
        pipe.unet = module
    else:
        pipe.vae = module
    if sampler is not None:
        pipe.scheduler = make_scheduler(sampler, scheduler_config(pipe))
    return pipe


def load(kind: str, folder: Path | None = None):
    """The verified student of `kind` as a float32 module in eval mode, and its manifest."""
    folder = Path(folder or default_dir(kind))
    if not (folder / storage.MANIFEST).is_file():
        raise ConfigError(f"no {kind} student at {str(folder)!r} (no {storage.MANIFEST}); build it with "
                          f"`sdperf train-student {kind}` (at most about 30 minutes on 2 cores)")
    manifest = storage.verify(folder)
    return _read(kind, folder), manifest


def _read(kind: str, folder: Path):
    from diffusers import AutoencoderTiny, UNet2DConditionModel

    cls = AutoencoderTiny if kind == "tiny-decoder" else UNet2DConditionModel
    return cls.from_pretrained(str(Path(folder) / PART[kind]), torch_dtype=torch.float32).eval().requires_grad_(False)


def _judge(recipe: StudentRecipe, teacher_folder: Path, module, net) -> dict:
    """Adherence and domain FID of the student on the teacher's pipeline at check_steps (domain_quality.judge)."""
    from sdperf.model.pipelines import build_from_weights

    real = domain_quality.Real.of(net, 2000 if recipe.check_images >= 100 else recipe.check_images)
    pipe = place(build_from_weights(str(teacher_folder), "plms"), recipe.kind, module, SAMPLER[recipe.kind])
    return domain_quality.judge(pipe, net, real, recipe.check_images, recipe.check_guidance, recipe.check_steps)


def run(recipe: StudentRecipe, out: Path, teacher_folder: Path | None = None, show: bool = True, command: str = "",
        say=print) -> dict:
    """Train (or resume) the student and write `out`; returns its manifest."""
    teacher_folder = Path(teacher_folder or storage.default_dir())
    teacher, net, teacher_manifest = storage.load(teacher_folder)
    teacher.unet.requires_grad_(False)
    teacher.vae.requires_grad_(False)
    teacher.text_encoder.requires_grad_(False)
    out = Path(out)
    work = work_dir(recipe, out, _teacher_digest(teacher_manifest))
    work.mkdir(parents=True, exist_ok=True)
    loop.save_json(work / "recipe.json", recipe.to_dict())
    times = json.loads((work / TIMES).read_text()) if (work / TIMES).is_file() else {}
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))

    def timed(name: str, fn):
        start = time.perf_counter()
        try:
            return fn()
        finally:
            times[name] = times.get(name, 0.0) + time.perf_counter() - start
            loop.save_json(work / TIMES, times)

    if not (work / DATA).is_file():
        loop.save(work / DATA, timed("data", lambda: distillation.encode_data(teacher, recipe)))
    data = loop.load(work / DATA)
    module, curve = timed("training", lambda: _train(recipe, teacher, data, work, show))
    store_dir = out.with_name(out.name + ".partial")
    shutil.rmtree(store_dir, ignore_errors=True)
    store_dir.mkdir(parents=True)
    module.to(storage.STORED_DTYPE).save_pretrained(str(store_dir / PART[recipe.kind]), safe_serialization=True)
    stored = _read(recipe.kind, store_dir)  # judge what is stored (float16 weights as float32)
    verdict = timed("judge", lambda: _judge(recipe, teacher_folder, stored, net))
    loop.save_json(store_dir / "training.json", {recipe.kind: curve})
    from sdperf.config import architectures

    record = dict(storage.provenance(command), kind=recipe.kind, recipe=recipe.to_dict(), times_s=dict(times),
                  teacher={"folder": os.path.relpath(teacher_folder, out.parent),
                           "commit": teacher_manifest.get("commit"), "weights": _teacher_digest(teacher_manifest)},
                  judge={"student": verdict, "sampler": SAMPLER[recipe.kind]},
                  parameters={PART[recipe.kind]: architectures.count_parameters(stored)})
    manifest = storage.write_manifest(store_dir, record)
    if out.exists():
        shutil.rmtree(out)
    os.replace(store_dir, out)
    say(f"{recipe.kind} student in {out}: adherence {verdict['adherence']:.3f} [{verdict['adherence_ci'][0]:.3f}-"
        f"{verdict['adherence_ci'][1]:.3f}], domain FID {verdict['fid']:.2f} at guidance {recipe.check_guidance}, "
        f"{recipe.check_steps} {SAMPLER[recipe.kind]} steps; {sum(times.values()) / 60:.1f} min")
    return manifest


def check_target(target: Path, recipe: StudentRecipe, force: bool) -> None:
    """Refuse, before any training, to replace a student made by another recipe, unless `--force`."""
    if target.exists() and not (target / storage.MANIFEST).is_file():
        raise ConfigError(f"--out {str(target)!r} exists and is not a student folder; choose a new folder")
    if force or not target.exists():
        return
    try:
        made = storage.read_manifest(target).get("recipe")
    except ConfigError:
        made = None
    ours = recipe.to_dict()
    if made == ours:
        return
    differ = (sorted(k for k in set(ours) | set(made) if made.get(k) != ours.get(k)) if isinstance(made, dict)
              else ["its manifest records no readable recipe"])
    raise ConfigError(f"--out {str(target)!r} holds a student made by another recipe (differing: {', '.join(differ)});"
                      " this run would replace it. Give --out a new folder, or add --force to replace it")


def main(kind: str, seed: int = 0, out: str | None = None, quick: bool = False, show: bool = True,
         force: bool = False, teacher: str | None = None) -> int:
    recipe = recipes.quick(kind, seed) if quick else recipes.recipe(kind, seed)
    target = Path(out) if out else default_dir(kind, quick)
    check_target(target, recipe, force)
    command = f"sdperf train-student {kind}" + (f" --seed {seed}" if seed else "") + (" --quick" if quick else "") \
        + (f" --out {out}" if out else "") + (" --force" if force else "") + (f" --teacher {teacher}" if teacher else "")
    run(recipe, target, teacher_folder=Path(teacher) if teacher else None, show=show, command=command)
    return 0
