"""Study profiles: YAML files in params/, validated before any model is built.

Validation lives here, apart from torch, so that a bad profile fails in well under a second.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sdperf.architectures import ARCHS, vae_scale_factor
from sdperf.errors import ConfigError
from sdperf.paths import params_dir

ARCHITECTURES = tuple(ARCHS)
SCHEDULERS = ("plms", "ddim", "euler", "dpmpp-2m")
DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("cpu", "cuda")
AUTO = "auto"
SECTIONS = ("training", "quality", "serving", "notebooks")
PROFILE_ENV = "SDPERF_PROFILE"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Profile:
    """One study setting; every field comes from the YAML file (none is derived silently)."""

    name: str
    description: str
    arch: str
    resolution: int
    steps: int
    scheduler: str
    guidance_scale: float
    batch_sizes: tuple[int, ...]
    dtype: str
    device: str
    warmup: int
    repeats: int
    seed: int
    prompt: str
    matmul_size: int
    cell_timeout_s: int
    variant_budget_s: int
    weights: str | None = None
    # fresh-process rounds every compared configuration runs in (sdperf.rounds); 3 is the least a range means
    rounds: int = 3
    # steps of the first call, timed apart: None = a whole generation at `steps`; 1 = a one-step generation, which
    # runs every stage once (all lazy compilation and allocation land there) at a fraction of the cost
    first_call_steps: int | None = None
    # 09_fewer_steps' untimed drift generations (the reference sampler at 50 steps, each scheduler at its own): on
    # random weights they measure trajectories, not quality, and cost ~7 minutes of SD 1.5 on 2 cores
    scheduler_drift: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Settings of the studies beyond the inference ladder, one mapping each; the package that owns a section
    # validates its keys (sdperf.training / sdperf.quality / sdperf.serving), before any model is built.
    training: dict = field(default_factory=dict)
    quality: dict = field(default_factory=dict)
    serving: dict = field(default_factory=dict)
    # Notebook parameters `sdperf run` sets over a notebook's own defaults: {notebook: {parameter: value}}, checked
    # by sdperf.runner against the notebooks' parameter cells before anything runs (nbval runs the defaults)
    notebooks: dict = field(default_factory=dict)

    @property
    def latent_size(self) -> int:
        return self.resolution // vae_scale_factor(self.arch)

    def summary(self) -> dict:
        d = dataclasses.asdict(self)
        d["batch_sizes"] = list(self.batch_sizes)
        d.pop("notes")
        for key in SECTIONS:
            d.pop(key)
        return d


_FIELDS = {f.name: f for f in dataclasses.fields(Profile)}
_REQUIRED = [n for n, f in _FIELDS.items()
             if n != "name" and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def available_profiles() -> list[str]:
    return sorted(p.stem for p in params_dir().glob("*.yml"))


def _choices(valid) -> str:
    return ", ".join(valid)


def _check_choice(profile: str, key: str, value, valid) -> None:
    if value not in valid:
        raise ConfigError(f"profile {profile!r}: {key} {value!r} is not valid; choose one of: {_choices(valid)}")


def _check_positive_int(profile: str, key: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"profile {profile!r}: {key} must be an integer >= {minimum}, got {value!r}")


def gpu_available() -> bool:
    """True when torch sees a CUDA device; imported lazily so validation stays fast without a GPU stack."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return torch.cuda.is_available()


def resolve_name(name: str | None = None) -> str:
    """'auto' (or nothing) -> $SDPERF_PROFILE if set, else 'cpu' without a GPU and a GPU profile with one."""
    name = name or AUTO
    if name != AUTO:
        return name
    env = os.environ.get(PROFILE_ENV)
    if env:
        return env
    if not gpu_available():
        return "cpu"
    import torch

    gpu = torch.cuda.get_device_name(0)
    return "sd15-a10g" if "A10" in gpu and "A100" not in gpu else "sd15-a100"


def _check_weights(profile: str, weights) -> None:
    if weights is None:
        return
    if not isinstance(weights, str) or not weights:
        raise ConfigError(f"profile {profile!r}: weights must be a local folder or a hub id, got {weights!r}")
    path = Path(weights).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise ConfigError(f"profile {profile!r}: weights folder {str(path)!r} has no model_index.json; "
                              "expected a diffusers pipeline folder (save_pretrained layout)")
        return
    looks_local = weights.startswith(("/", ".", "~")) or os.sep + os.sep in weights or path.exists()
    if looks_local or not _HUB_ID.match(weights):
        raise ConfigError(f"profile {profile!r}: weights folder {weights!r} does not exist; give an existing "
                          "diffusers pipeline folder or a hub id such as 'org/model'")


def check_device(profile: str, device: str, dtype: str) -> None:
    """Fail early when the device is absent or cannot run the dtype (probed with one tiny conv + matmul)."""
    _check_choice(profile, "device", device, DEVICES)
    _check_choice(profile, "dtype", dtype, DTYPES)
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        have = ["cpu"]
        raise ConfigError(f"profile {profile!r}: device 'cuda' is not available on this machine; "
                          f"available devices: {_choices(have)} (use the 'cpu' profile or SDPERF_PROFILE=cpu)")
    try:
        t = getattr(torch, dtype)
        x = torch.ones(1, 2, 4, 4, device=device, dtype=t)
        w = torch.ones(2, 2, 3, 3, device=device, dtype=t)
        torch.nn.functional.conv2d(x, w, padding=1).flatten(1) @ torch.ones(32, 2, device=device, dtype=t)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"profile {profile!r}: dtype {dtype!r} cannot run on device {device!r} here ({exc}); "
                          f"choose one of: {_choices(DTYPES)} that this device supports") from exc


def load_profile(name: str | None = None, *, check_runtime: bool = True) -> Profile:
    """Load and validate params/<name>.yml; 'auto' resolves as in resolve_name()."""
    name = resolve_name(name)
    valid = available_profiles()
    if name not in valid:
        raise ConfigError(f"unknown profile {name!r}; valid profiles: {_choices(valid + [AUTO])}")
    path = params_dir() / f"{name}.yml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"profile {name!r}: {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"profile {name!r}: {path} must be a mapping of key: value")
    allowed = [k for k in _FIELDS if k != "name"]
    for key in raw:
        if key not in _FIELDS or key == "name":
            raise ConfigError(f"profile {name!r}: unknown key {key!r}; valid keys: {_choices(allowed)}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"profile {name!r}: missing keys {_choices(missing)}")
    _check_choice(name, "arch", raw["arch"], ARCHITECTURES)
    _check_choice(name, "scheduler", raw["scheduler"], SCHEDULERS)
    _check_choice(name, "dtype", raw["dtype"], DTYPES)
    _check_choice(name, "device", raw["device"], DEVICES)
    for key in ("steps", "repeats", "resolution", "matmul_size", "cell_timeout_s", "variant_budget_s"):
        _check_positive_int(name, key, raw[key])
    for key in ("warmup", "seed"):
        _check_positive_int(name, key, raw[key], minimum=0)
    if "rounds" in raw:
        _check_positive_int(name, "rounds", raw["rounds"], minimum=3)
    if not isinstance(raw.get("scheduler_drift", True), bool):
        raise ConfigError(f"profile {name!r}: scheduler_drift must be true or false, got {raw['scheduler_drift']!r}")
    if raw.get("first_call_steps") is not None:
        _check_positive_int(name, "first_call_steps", raw["first_call_steps"])
    sizes = raw["batch_sizes"]
    if not isinstance(sizes, list) or not sizes:
        raise ConfigError(f"profile {name!r}: batch_sizes must be a non-empty list of integers, got {sizes!r}")
    for b in sizes:
        _check_positive_int(name, "batch_sizes entry", b)
    multiple = 8 * vae_scale_factor(raw["arch"])
    if raw["resolution"] % multiple:
        raise ConfigError(f"profile {name!r}: resolution {raw['resolution']} must be a multiple of {multiple} "
                          f"for arch {raw['arch']!r}")
    _check_weights(name, raw.get("weights"))
    for key in SECTIONS:
        if not isinstance(raw.get(key, {}), dict):
            raise ConfigError(f"profile {name!r}: {key} must be a mapping of key: value, got {raw[key]!r}")
    if check_runtime:
        check_device(name, raw["device"], raw["dtype"])
    values = dict(raw, name=name, batch_sizes=tuple(sizes), guidance_scale=float(raw["guidance_scale"]),
                  notes=tuple(raw.get("notes") or ()))
    return Profile(**values)
