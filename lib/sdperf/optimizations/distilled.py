"""What CPU users run instead of a 50-step guided solve: step-distilled students and a tiny decoder.

- `distill:lcm@<n>`: a latent consistency student (Luo et al. 2023), the guidance scale embedded in the UNet
  (`time_cond_proj_dim`, as diffusers' LCM UNets), one call per step at the prompt batch, sampled by diffusers'
  LCMScheduler at n steps.
- `distill:guidance`: a guidance-distilled student (Meng et al. 2023, stage 1): one call per step returns the guided
  noise, under whatever scheduler the stack runs (Euler 10 in 10 calls instead of 20 half-batches).
- `decoder:tiny`: a decoder of TAESD's architecture (diffusers AutoencoderTiny) in place of the VAE's.

On the reference model each loads its trained student from beside the teacher (`sdperf train-student`); on any
other random-init profile it is the profile's own network with the guidance embedding (or AutoencoderTiny's
published shape) at seeded random init, so the speed is the real architecture's and the picture means nothing.
"""
from __future__ import annotations

from pathlib import Path

import torch

from sdperf.optimizations.catalog import DECODER, DISTILLED, Technique

NOTEBOOK = "09_fewer_steps"
KEY_PREFIXES = ("distill",)
LCM_STEPS = (1, 2, 4, 8)
GUIDANCE_DIM = 256  # time_cond_proj_dim of diffusers' LCM UNets of SD 1.5
TAESD_WIDTH = 64  # TAESD's channels in every block
TRANSFER_STUDENT = ("may not transfer",
                    "a 4M-parameter student of a five-word domain distils far more easily than SD 1.5 does: "
                    "LCM-LoRA on SD 1.5 at 4 steps has COCO-30k FID 23.62 against its teacher's 13.45, LCM at 4 "
                    "steps 11.10 against DPM-Solver++'s 18.43 (LAION); judge the published costs, not this verdict")
TRANSFER_DECODER = ("may not transfer",
                    "a tiny decoder of a flat-coloured 32 px domain reproduces its VAE far more easily than TAESD "
                    "reproduces SD's at 512 px, where fine texture is what it loses; TAESD publishes no quality figure")


def student_kind(key: str) -> str | None:
    """The student a catalog key loads ('lcm', 'guidance', 'tiny-decoder'), None for any other key."""
    if key == "decoder:tiny":
        return "tiny-decoder"
    if key.startswith("distill:"):
        return "lcm" if key.startswith("distill:lcm") else "guidance"
    return None


def _student_folder(ctx, kind: str) -> Path | None:
    """The trained student beside the weights the profile loads, or None for a random-init profile."""
    from sdperf.config.profiles import weights_source
    from sdperf.refmodel.student_recipe import FOLDERS

    if not ctx.profile.weights:
        return None
    source, _ = weights_source(ctx.profile.weights)  # a hub id has no folder beside it: no student found there
    return Path(source).parent / FOLDERS[kind]


def availability(ctx, kind: str) -> tuple[bool, str]:
    folder = _student_folder(ctx, kind)
    if folder is None:
        what = "AutoencoderTiny at TAESD's shape" if kind == "tiny-decoder" else \
            "the profile's UNet with a guidance embedding"
        return True, f"{what} at seeded random init: the real architecture's speed, runs wherever the UNet runs"
    if not (folder / "manifest.json").is_file():
        return False, (f"no trained {kind} student at {folder} (only the reference model has students here; "
                       f"`sdperf train-student {kind}` makes one in about 30 minutes on 2 cores)")
    return True, f"the trained {kind} student of {folder.parent.name} ({folder.name}, verified against its manifest)"


def _random_unet(pipe, seed: int):
    """The profile's UNet given a guidance embedding in place (no second copy of its weights in memory): what
    UNet2DConditionModel builds with `time_cond_proj_dim`, its projection at seeded random init."""
    unet = pipe.unet
    emb = unet.time_embedding
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        emb.cond_proj = torch.nn.Linear(GUIDANCE_DIM, emb.linear_1.in_features, bias=False)
    unet.register_to_config(time_cond_proj_dim=GUIDANCE_DIM)
    return unet


def apply_student(pipe, ctx, kind: str, sampler: str | None):
    """The pipeline with its UNet (or VAE) replaced by the student, in the pipeline's device and dtype."""
    from sdperf.model.generation import module_device, module_dtype
    from sdperf.refmodel import distillation, student_command

    folder = _student_folder(ctx, kind)
    target = pipe.vae if kind == "tiny-decoder" else pipe.unet
    device, dtype = module_device(target), module_dtype(target)
    if folder is not None:
        module, manifest = student_command.load(kind, folder)
        ctx.facts.update({f"{kind}_student": folder.name, f"{kind}_commit": manifest.get("commit")})
    elif kind == "tiny-decoder":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ctx.profile.seed + 11)
            # TAESD's published shape (2.45M parameters at SD's 8x), at as many levels as the profile's VAE
            module = distillation.tiny_decoder(TAESD_WIDTH, len(pipe.vae.config.block_out_channels))
    else:
        module = _random_unet(pipe, ctx.profile.seed + 12)
    student_command.place(pipe, kind, module.eval().requires_grad_(False).to(device, dtype), sampler)
    return pipe


def technique(prefix: str, arg: str) -> Technique:
    """distill:lcm@<steps> (the consistency student at that step count) or distill:guidance."""
    if arg == "guidance":
        return Technique(f"{prefix}:guidance", "guidance-distilled student", DISTILLED, NOTEBOOK,
                         transfer=TRANSFER_STUDENT, apply=lambda pipe, ctx: apply_student(pipe, ctx, "guidance", None),
                         availability=lambda ctx: availability(ctx, "guidance"), changes_output=True, loop_only=True,
                         note="one UNet call per step at the prompt batch returns the guided noise (Meng et al.)")
    name, sep, steps = arg.partition("@")
    if name != "lcm" or not sep or not steps.isdigit() or int(steps) < 1:
        raise ValueError(f"give distill:lcm@<steps> with steps >= 1 (e.g. distill:lcm@4) or distill:guidance; "
                         f"got {arg!r}")
    n = int(steps)
    return Technique(f"{prefix}:lcm@{n}", f"LCM student, {n} steps", DISTILLED, NOTEBOOK, transfer=TRANSFER_STUDENT,
                     apply=lambda pipe, ctx: apply_student(pipe, ctx, "lcm", "lcm"),
                     availability=lambda ctx: availability(ctx, "lcm"), changes_output=True, loop_only=True,
                     steps=n, sampler="lcm", owns_sampler=True,
                     note=f"latent consistency student: {n} LCMScheduler steps, one call each at the prompt batch")


def techniques() -> list[Technique]:
    tiny = Technique("decoder:tiny", "tiny decoder (TAESD's architecture)", DECODER, NOTEBOOK,
                     transfer=TRANSFER_DECODER, apply=lambda pipe, ctx: apply_student(pipe, ctx, "tiny-decoder", None),
                     availability=lambda ctx: availability(ctx, "tiny-decoder"), changes_output=True,
                     note="AutoencoderTiny's decoder in place of the VAE's")
    return [technique("distill", f"lcm@{n}") for n in LCM_STEPS] + [technique("distill", "guidance"), tiny]
