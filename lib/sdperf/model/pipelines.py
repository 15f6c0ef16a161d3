"""Build the diffusers pipeline a profile names: real architecture at seeded random init (seeded per component, so
every build of a profile holds identical weights), or real weights loaded offline from a local folder.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
from pathlib import Path

import diffusers
import torch

from sdperf.config import architectures
from sdperf.config.profiles import Profile
from sdperf.model.tokenizer import clip_tokenizer

SCHEDULER_CLASSES = {
    # PLMS is diffusers' PNDM without the Runge-Kutta warm-up steps (what the NeMo and SD papers call PLMS).
    "plms": ("PNDMScheduler", dict(skip_prk_steps=True, set_alpha_to_one=False)),
    "ddim": ("DDIMScheduler", dict(set_alpha_to_one=False, clip_sample=False)),
    "euler": ("EulerDiscreteScheduler", dict(timestep_spacing="leading")),
    "dpmpp-2m": ("DPMSolverMultistepScheduler", dict(algorithm_type="dpmsolver++", solver_order=2)),
    "unipc": ("UniPCMultistepScheduler", dict(solver_order=2)),  # UniPC (Zhao et al. 2023), bh2 predictor-corrector
    # LCM's multistep consistency sampling (Luo et al. 2023): a consistency student's sampler, never a teacher's
    "lcm": ("LCMScheduler", dict(clip_sample=False)),
}


diffusers.utils.logging.set_verbosity_error()  # its warning at every .to(dtype) of a random-init model is noise


# Where a sampler's steps lie (diffusers' `timestep_spacing`): "leading" (SD 1.5's) starts below the last training
# timestep, "trailing" and "linspace" at it, where the initial noise is (Lin et al. 2024). "karras": Karras et al.
# 2022's noise levels (use_karras_sigmas), denser near the image, where a solve's error is made.
SPACINGS = ("leading", "trailing", "linspace", "karras")
SPACING_SEP = ":"


def sampler_spec(name: str, spacing: str | None = None) -> str:
    """A sampler as one string: '<scheduler>' (the model's configured spacing) or '<scheduler>:<spacing>'."""
    return name if spacing is None else f"{name}{SPACING_SEP}{spacing}"


def parse_sampler(spec: str) -> tuple[str, str | None]:
    """'euler:trailing' -> ('euler', 'trailing'); 'euler' -> ('euler', None), each part checked."""
    name, sep, spacing = str(spec).partition(SPACING_SEP)
    if name not in SCHEDULER_CLASSES:
        raise ValueError(f"scheduler {name!r} is not valid; choose one of: {', '.join(SCHEDULER_CLASSES)}")
    if sep and spacing not in spacings(name):
        raise ValueError(f"spacing {spacing!r} of sampler {spec!r} is not valid; choose one of: "
                         f"{', '.join(spacings(name))} (or none: the model's configured spacing)")
    return name, (spacing if sep else None)


def spacings(name: str) -> tuple[str, ...]:
    """The spacings scheduler `name` offers (karras only where its class takes Karras sigmas)."""
    keys = set(inspect.signature(getattr(diffusers, SCHEDULER_CLASSES[name][0]).__init__).parameters)
    return tuple(s for s in SPACINGS if s != "karras" or "use_karras_sigmas" in keys)


def sampler_key(spec: str, steps: int) -> str:
    """A sampler at a step count in the catalog's grammar: ('euler:trailing', 6) -> 'euler@6:trailing'."""
    name, spacing = parse_sampler(spec)
    return f"{name}@{int(steps)}" + (f"{SPACING_SEP}{spacing}" if spacing else "")


def make_scheduler(spec: str, base_config: dict):
    """The scheduler `spec` names on the model's noise schedule, which it keeps for a later switch to start from."""
    name, spacing = parse_sampler(spec)
    cls_name, extra = SCHEDULER_CLASSES[name]
    cls = getattr(diffusers, cls_name)
    keys = set(inspect.signature(cls.__init__).parameters)  # accept only what the class takes
    placed = {} if spacing is None else {"timestep_spacing": spacing} if spacing != "karras" else \
        {"use_karras_sigmas": True, "timestep_spacing": "linspace"}  # Euler's Karras sigmas span its spaced steps
    if "use_karras_sigmas" in placed and "use_karras_sigmas" not in keys:
        raise ValueError(f"spacing {spacing!r} is not one {name} ({cls_name}) offers; choose one of: "
                         f"{', '.join(spacings(name))}")
    merged = {**base_config, **extra, **placed}
    sched = cls(**{k: v for k, v in merged.items() if k in keys})
    sched.sdperf_model_config = dict(base_config)
    return sched


def timestep_span(spec: str, steps: int, base_config: dict) -> tuple[int, int]:
    """(first, last) timestep at which the sampler `spec` calls the UNet at `steps` on this noise schedule."""
    sched = make_scheduler(spec, base_config)
    sched.set_timesteps(int(steps), device="cpu")
    return int(round(float(sched.timesteps[0]))), int(round(float(sched.timesteps[-1])))


def _seeded(seed: int, build):
    """Build a module under a fixed seed so its random init is reproducible, independent of call order."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _weights_file(cache: Path, arch_name: str, component: str, config: dict, seed: int) -> Path:
    what = json.dumps({"arch": arch_name, "component": component, "config": config, "seed": seed,
                       "torch": torch.__version__, "diffusers": diffusers.__version__}, sort_keys=True, default=str)
    digest = hashlib.sha256(what.encode()).hexdigest()[:16]
    return Path(cache) / f"{arch_name}-{component}-seed{seed}-{digest}.safetensors"


def _assign(module: torch.nn.Module, tensors: dict) -> None:
    """Put saved tensors in place of a meta-device module's parameters and buffers (non-persistent ones too)."""
    for name, tensor in tensors.items():
        owner, _, leaf = name.rpartition(".")
        sub = module.get_submodule(owner)
        if leaf in sub._parameters:
            sub._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)
        elif leaf in sub._buffers:
            sub._buffers[leaf] = tensor
        else:
            raise KeyError(f"{name} is neither a parameter nor a buffer of {type(module).__name__}")


def _cached(cache: Path | None, arch_name: str, component: str, config: dict, seed: int, make):
    """The seeded random-init network `make()` builds, read from `cache` when an earlier process saved it there (a
    sealed file, sdperf.store.verified, named by all the weights depend on; rebuilt unless it fills the network)."""
    from safetensors.torch import load_file, save_file

    from sdperf.store import verified

    build = lambda: _seeded(seed, make)  # noqa: E731
    if cache is None:
        return build()
    path = _weights_file(cache, arch_name, component, config, seed)
    with torch.device("meta"):
        shell = make()

    declared = {k: (tuple(t.shape), t.dtype) for k, t in [*shell.named_parameters(), *shell.named_buffers()]}

    def read(p):
        tensors = load_file(str(p))
        odd = [k for k, t in tensors.items() if declared.get(k, (None, None)) != (tuple(t.shape), t.dtype)]
        if odd:
            raise ValueError(f"{len(odd)} tensor(s) are not the network's own (shape or dtype), e.g. {odd[0]}")
        _assign(shell, {k: v.clone() for k, v in tensors.items()})
        return shell

    module = verified.load(path, read, expect=_filled)
    if module is not None:
        return module
    module = build()
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    verified.write(path, lambda tmp: save_file({k: v.detach().contiguous() for k, v in tensors.items()}, tmp))
    return module


def _filled(module: torch.nn.Module) -> str | None:
    """Why a network read from the weights cache is not whole: a tensor the file did not fill."""
    missing = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    return f"{len(missing)} tensor(s) are missing from the file, e.g. {missing[0]}" if missing else None


def build_random(arch_name: str, scheduler: str = "plms", seed: int = 0, weights_cache: Path | None = None):
    """The architecture from its hand-written config, random weights, fp32, on the CPU (`weights_cache`: _cached)."""
    from diffusers import AutoencoderKL, StableDiffusionPipeline, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    arch = architectures.get(arch_name)
    unet = _cached(weights_cache, arch_name, "unet", dict(arch.unet), seed,
                   lambda: UNet2DConditionModel(**arch.unet))
    vae = _cached(weights_cache, arch_name, "vae", dict(arch.vae), seed + 1, lambda: AutoencoderKL(**arch.vae))
    text_encoder = _cached(weights_cache, arch_name, "text_encoder", dict(arch.text_encoder), seed + 2,
                           lambda: CLIPTextModel(CLIPTextConfig(**arch.text_encoder)))
    sched = make_scheduler(scheduler, arch.scheduler)
    if arch.family == "sd":
        pipe = StableDiffusionPipeline(
            vae=vae, text_encoder=text_encoder, tokenizer=clip_tokenizer(arch.pad_token), unet=unet,
            scheduler=sched, safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    else:
        text_encoder_2 = _seeded(seed + 3, lambda: CLIPTextModelWithProjection(CLIPTextConfig(**arch.text_encoder_2)))
        pipe = StableDiffusionXLPipeline(
            vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
            tokenizer=clip_tokenizer(arch.pad_token), tokenizer_2=clip_tokenizer(arch.pad_token_2),
            unet=unet, scheduler=sched)
    pipe.set_progress_bar_config(disable=True)
    return _eval(pipe)


def _eval(pipe):
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            module.eval().requires_grad_(False)
    return pipe


TOKENIZER_CLASSES = ("CLIPTokenizer", "CLIPTokenizerFast")


def _tokenizer_stamp(folder: str) -> tuple:
    """What a cached tokenizer of `folder` is valid for: each tokenizer file's name, size and modification time."""
    files = sorted(p for p in Path(folder).glob("tokenizer*/*") if p.is_file())
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)


@functools.lru_cache(maxsize=4)
def local_tokenizers(folder: str, stamp: tuple) -> dict:
    """The tokenizers of a local diffusers folder, loaded once per process and shared by its pipelines (`stamp`: its
    files, so an edited folder loads again); concurrent tokenizing is serving's to guard."""
    import transformers

    index = json.loads((Path(folder) / "model_index.json").read_text())
    out = {}
    for name, spec in index.items():
        if isinstance(spec, list) and len(spec) == 2 and spec[0] == "transformers" and spec[1] in TOKENIZER_CLASSES:
            out[name] = getattr(transformers, spec[1]).from_pretrained(str(Path(folder) / name))
    return out


def build_from_weights(weights: str, scheduler: str):
    """Real weights from a local diffusers folder (offline) or a 'hub:org/model' id (needs internet)."""
    from diffusers import DiffusionPipeline

    from sdperf.config.profiles import weights_source
    from sdperf.core.quiet import loading_bars_off
    from sdperf.refmodel.manifest import verify_weights

    source, local = weights_source(weights)
    verify_weights(source, local)  # a local folder with a manifest.json loads only if it matches it
    loading_bars_off()
    shared = local_tokenizers(source, _tokenizer_stamp(source)) if local else {}
    pipe = DiffusionPipeline.from_pretrained(source, dtype=torch.float32, local_files_only=local, **shared)
    pipe.scheduler = make_scheduler(scheduler, dict(pipe.scheduler.config))
    pipe.set_progress_bar_config(disable=True)
    return _eval(pipe)


def build_pipeline(profile: Profile, *, device: str | None = None, dtype: torch.dtype = torch.float32,
                   weights_cache: Path | None = None):
    """The profile's pipeline on its device; fp32 unless asked (the baseline every rung is compared with)."""
    if profile.weights:
        pipe = build_from_weights(profile.weights, profile.scheduler)
    else:
        pipe = build_random(profile.arch, profile.scheduler, seed=profile.seed, weights_cache=weights_cache)
    return pipe.to(device or profile.device, dtype)


def component_parameters(pipe) -> dict[str, int]:
    """Parameter count per network of the pipeline (a deterministic fingerprint of the architecture)."""
    return {name: architectures.count_parameters(m) for name, m in pipe.components.items()
            if isinstance(m, torch.nn.Module)}


def is_sdxl(pipe) -> bool:
    return getattr(pipe, "text_encoder_2", None) is not None
