"""Study profiles: YAML files in params/, validated apart from torch, so a bad one fails in well under a second."""
from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sdperf.config.architectures import ARCHS, vae_scale_factor
from sdperf.core.errors import ConfigError, short
from sdperf.core.paths import params_dir

ARCHITECTURES = tuple(ARCHS)
SCHEDULERS = ("plms", "ddim", "euler", "dpmpp-2m")
DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("cpu", "cuda")
AUTO = "auto"
SECTIONS = ("training", "quality", "serving", "notebooks", "expected")
PROFILE_ENV = "SDPERF_PROFILE"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a plain folder name under reports/, no '..'
MAX_YAML_DEPTH = 20  # nested mappings/lists a study file may hold; the profiles use 3
MAX_YAML_BYTES = 1 << 20  # a profile is a few KB; a bigger file is not one
MAX_SEED = 2**63 - 1  # the largest seed every consumer takes (torch.Generator, numpy, int64 columns)


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
    rounds: int = 3  # fresh-process rounds per compared configuration (sdperf.measure.rounds); 3 at least
    first_call_steps: int | None = None  # steps of the first call, timed apart (None: all); 1 runs each stage once
    scheduler_drift: bool = True  # 09_fewer_steps' untimed drift generations (minutes of SD 1.5 on a CPU)
    notes: tuple[str, ...] = field(default_factory=tuple)
    techniques: tuple[str, ...] = field(default_factory=tuple)  # catalog keys or '+'-joined stacks, each once
    # settings of the studies beyond the inference ladder, validated by the package that owns each section
    training: dict = field(default_factory=dict)
    quality: dict = field(default_factory=dict)
    serving: dict = field(default_factory=dict)
    notebooks: dict = field(default_factory=dict)  # {notebook: {parameter: value}} set over a notebook's defaults
    expected: dict = field(default_factory=dict)  # what a part takes with no run on record (sdperf.run.eta)

    @property
    def setting(self) -> str:
        """What besides technique and batch decides a row's memory: arch, resolution, guidance, weights, device."""
        guidance = f"guidance {self.guidance_scale:g}" if self.guidance_scale > 1 else "no guidance"
        return f"{self.arch} {self.resolution}px, {guidance}, {self.weights or 'random'} weights, {self.device}"

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


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1}, again on line "
                    f"{key_node.start_mark.line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent, index):
        """Anchors and aliases are refused ("billion laughs"), and so is nesting deeper than MAX_YAML_DEPTH."""
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (&name, *name, <<: *name) are not allowed here; write each value "
                "out in full", event.start_mark)
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"values nested more than {MAX_YAML_DEPTH} levels deep are not allowed here",
                    event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_yaml(path: Path):
    """A YAML file through _UniqueKeyLoader; OSError unless a regular file of at most MAX_YAML_BYTES."""
    path = Path(path)
    with open(path, "rb", opener=_nonblocking) as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{str(path)!r} is not a regular file")
        if info.st_size > MAX_YAML_BYTES:
            raise OSError(f"{str(path)!r} is {info.st_size:,} bytes, over the {MAX_YAML_BYTES:,} a study file may be")
        text = fh.read(MAX_YAML_BYTES + 1).decode("utf-8")
    return yaml.load(text, Loader=_UniqueKeyLoader)


def _nonblocking(path, flags):
    """open() of a FIFO with no writer blocks before fstat can tell what it is; O_NONBLOCK returns at once."""
    return os.open(path, flags | os.O_NONBLOCK)


def is_regular_file(path: Path) -> bool:
    """A regular file (after symlinks): FIFOs, sockets and devices in params/ are not profiles."""
    try:
        return stat.S_ISREG(Path(path).stat().st_mode)
    except OSError:
        return False


def memory_bytes() -> int:
    """This machine's physical memory: the ceiling of every size a profile may ask for."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def resolution_bytes(arch: str, resolution: int, batch: int) -> int:
    """A floor on one generation's memory: four fp32 full-resolution maps of the VAE decoder's last block per image."""
    channels = ARCHS[arch].vae["block_out_channels"][0]
    return 4 * channels * resolution * resolution * 4 * batch


def matmul_bytes(size: int) -> int:
    """The roof's matmul: two fp32 inputs (randn), their copies in the measured dtype and the output, n x n each."""
    return 5 * size * size * 4


def _check_sizes(profile: str, raw: dict) -> None:
    have = memory_bytes()
    need = resolution_bytes(raw["arch"], raw["resolution"], max(raw["batch_sizes"]))
    if need > have:
        raise ConfigError(f"profile {profile!r}: resolution {raw['resolution']} at batch {max(raw['batch_sizes'])} "
                          f"needs more than {_gib(need)} (four fp32 feature maps of the VAE decoder's last block per "
                          f"image), and this machine has {_gib(have)}; choose a smaller resolution or batch")
    need = matmul_bytes(raw["matmul_size"])
    if need > have:
        largest = int(math.sqrt(have / matmul_bytes(1)))
        raise ConfigError(f"profile {profile!r}: matmul_size {raw['matmul_size']} needs {_gib(need)} (five "
                          f"{raw['matmul_size']}x{raw['matmul_size']} fp32 matrices), and this machine has "
                          f"{_gib(have)}; choose at most {largest} (2048 reaches the roof on a CPU)")


def _check_guidance(profile: str, value) -> None:
    """Classifier-free guidance is on above 1 and off at exactly 1; below 1, nan or inf is no setting at all."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
        raise ConfigError(f"profile {profile!r}: guidance_scale must be a finite number >= 1 (1 = no guidance, "
                          f"7.5 = SD's default), got {short(value)}")


def available_profiles() -> list[str]:
    """The stems of params/*.yml that are regular files."""
    return sorted(p.stem for p in params_dir().glob("*.yml") if is_regular_file(p))


def check_profile_name(name: str) -> str:
    """A profile's name becomes a folder under reports/, so it must be one plain folder name."""
    if not isinstance(name, str) or not PROFILE_NAME.match(name):
        raise ConfigError(f"profile name {short(name)} is not valid: use letters, digits, '_', '-' and '.', "
                          "starting with a letter or digit (at most 64), as in params/<name>.yml; valid profiles: "
                          f"{_choices([n for n in available_profiles() if PROFILE_NAME.match(n)] + [AUTO])}")
    return name


def _choices(valid) -> str:
    return ", ".join(valid)


def _check_choice(profile: str, key: str, value, valid) -> None:
    if value not in valid:
        raise ConfigError(f"profile {profile!r}: {key} {short(value)} is not valid; choose one of: {_choices(valid)}")


def _check_positive_int(profile: str, key: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"profile {profile!r}: {key} must be an integer >= {minimum}, got {short(value)}")


def gpu_available() -> bool:
    """True when torch sees a CUDA device; imported lazily so validation stays fast."""
    import torch

    return torch.cuda.is_available()


def resolve_name(name: str | None = None) -> str:
    """'auto' (or None) -> $SDPERF_PROFILE, else 'cpu' without a GPU, a GPU profile with one; '' is an error."""
    if name is not None and not str(name).strip():
        raise ConfigError(f"profile name {name!r} is empty; valid profiles: {_choices(available_profiles() + [AUTO])}")
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


HUB_PREFIX = "hub:"  # weights from the Hugging Face hub are named explicitly: 'hub:org/model'


def weights_source(weights: str) -> tuple[str, bool]:
    """(what diffusers' from_pretrained takes, whether it is a local folder) for a checked `weights:` value."""
    if weights.startswith(HUB_PREFIX):
        return weights[len(HUB_PREFIX):], False
    return str(Path(weights).expanduser()), True


EXPECTED_KEYS = ("measured_on", "rounds_per_worker_s", "notebooks_s")


def _check_expected(profile: str, expected: dict) -> None:
    """The expected: section: measured_on (required), seconds per rounds worker and per notebook, each positive."""
    if not expected:
        return
    where = f"profile {profile!r}: expected"
    for key in expected:
        if key not in EXPECTED_KEYS:
            raise ConfigError(f"{where}: unknown key {short(key)}; valid keys: {_choices(list(EXPECTED_KEYS))}")
    if not isinstance(expected.get("measured_on"), str) or not expected["measured_on"].strip():
        raise ConfigError(f"{where}: measured_on must say which run on which machine gave the figures, got "
                          f"{short(expected.get('measured_on'))}")

    def positive(what: str, v) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise ConfigError(f"{where}: {what} must be a positive number of seconds, got {short(v)}")

    if "rounds_per_worker_s" in expected:
        positive("rounds_per_worker_s", expected["rounds_per_worker_s"])
    per = expected.get("notebooks_s", {})
    if not isinstance(per, dict):
        raise ConfigError(f"{where}: notebooks_s must be a mapping of notebook: seconds, got {short(per)}")
    for name, v in per.items():
        positive(f"notebooks_s[{short(name)}]", v)


def _check_weights(profile: str, weights) -> None:
    """An existing diffusers folder, or a hub id written as 'hub:org/model' (a bare missing path is a typo)."""
    if weights is None:
        return
    if not isinstance(weights, str) or not weights.strip():
        raise ConfigError(f"profile {profile!r}: weights must be a local diffusers folder or '{HUB_PREFIX}org/model', "
                          f"got {short(weights)}")
    if weights.startswith(HUB_PREFIX):
        if not _HUB_ID.match(weights[len(HUB_PREFIX):]):
            raise ConfigError(f"profile {profile!r}: weights {short(weights)} is not a hub id; write "
                              f"'{HUB_PREFIX}org/model', e.g. '{HUB_PREFIX}runwayml/stable-diffusion-v1-5'")
        return
    path = Path(weights).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise ConfigError(f"profile {profile!r}: weights folder {str(path)!r} has no model_index.json; "
                              "expected a diffusers pipeline folder (save_pretrained layout)")
        return
    hint = f" (for the hub id write '{HUB_PREFIX}{weights}')" if _HUB_ID.match(weights) else ""
    raise ConfigError(f"profile {profile!r}: weights folder {short(weights)} does not exist (looked at "
                      f"{str(path.absolute())!r}); give an existing diffusers pipeline folder or a hub id written as "
                      f"'{HUB_PREFIX}org/model'{hint}")


def check_device(profile: str, device: str, dtype: str) -> None:
    """Fail early when the device is absent or cannot run the dtype (probed with one tiny conv + matmul)."""
    _check_choice(profile, "device", device, DEVICES)
    _check_choice(profile, "dtype", dtype, DTYPES)
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"profile {profile!r}: device 'cuda' is not available on this machine; "
                          f"available devices: {_choices(['cpu'])} (use the 'cpu' profile or SDPERF_PROFILE=cpu)")
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
    name = check_profile_name(resolve_name(name))
    valid = available_profiles()
    if name not in valid:
        raise ConfigError(f"unknown profile {name!r}; valid profiles: {_choices(valid + [AUTO])}")
    path = params_dir() / f"{name}.yml"
    try:
        raw = read_yaml(path) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"profile {name!r}: {path} is not valid YAML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"profile {name!r}: {path} cannot be read as UTF-8 text ({exc})") from None
    except RecursionError:  # a construct the depth limit does not see; never a traceback
        raise ConfigError(f"profile {name!r}: {path} is nested too deeply to read") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"profile {name!r}: {path} must be a mapping of key: value")
    allowed = [k for k in _FIELDS if k != "name"]
    for key in raw:
        if key not in _FIELDS or key == "name":
            raise ConfigError(f"profile {name!r}: unknown key {short(key)}; valid keys: {_choices(allowed)}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"profile {name!r}: missing keys {_choices(missing)}")
    for key, valid in (("arch", ARCHITECTURES), ("scheduler", SCHEDULERS), ("dtype", DTYPES), ("device", DEVICES)):
        _check_choice(name, key, raw[key], valid)
    for key in ("steps", "repeats", "resolution", "matmul_size", "cell_timeout_s", "variant_budget_s"):
        _check_positive_int(name, key, raw[key])
    _check_positive_int(name, "seed", raw["seed"], minimum=0)
    if raw["seed"] > MAX_SEED:
        raise ConfigError(f"profile {name!r}: seed must be an integer from 0 to {MAX_SEED} (2**63-1), got "
                          f"{short(raw['seed'])}")
    if isinstance(raw["warmup"], int) and not isinstance(raw["warmup"], bool) and raw["warmup"] < 1:
        raise ConfigError(f"profile {name!r}: warmup must be an integer >= 1, got {short(raw['warmup'])}: it counts "
                          "the first call, which always runs (timed apart as set-up), so 0 would run as 1")
    _check_positive_int(name, "warmup", raw["warmup"])
    if "rounds" in raw:
        _check_positive_int(name, "rounds", raw["rounds"], minimum=3)
    if not isinstance(raw.get("scheduler_drift", True), bool):
        raise ConfigError(f"profile {name!r}: scheduler_drift must be true or false, got "
                          f"{short(raw['scheduler_drift'])}")
    if raw.get("first_call_steps") is not None:
        _check_positive_int(name, "first_call_steps", raw["first_call_steps"])
    sizes = raw["batch_sizes"]
    if not isinstance(sizes, list) or not sizes:
        raise ConfigError(f"profile {name!r}: batch_sizes must be a non-empty list of integers, got {short(sizes)}")
    for b in sizes:
        _check_positive_int(name, "batch_sizes entry", b)
    multiple = 8 * vae_scale_factor(raw["arch"])
    if raw["resolution"] % multiple:
        raise ConfigError(f"profile {name!r}: resolution {raw['resolution']} must be a multiple of {multiple} "
                          f"for arch {raw['arch']!r}")
    _check_guidance(name, raw["guidance_scale"])
    if not isinstance(raw["prompt"], str) or not raw["prompt"].strip():
        raise ConfigError(f"profile {name!r}: prompt must be a non-empty string, got {short(raw['prompt'])}")
    if not isinstance(raw["description"], str):
        raise ConfigError(f"profile {name!r}: description must be a string, got {short(raw['description'])}")
    _check_sizes(name, raw)
    _check_weights(name, raw.get("weights"))
    for key in SECTIONS:
        if not isinstance(raw.get(key, {}), dict):
            raise ConfigError(f"profile {name!r}: {key} must be a mapping of key: value, got {short(raw[key])}")
    _check_expected(name, raw.get("expected") or {})
    notes = raw.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ConfigError(f"profile {name!r}: notes must be a list of strings, got {short(raw.get('notes'))}")
    techniques = raw.get("techniques") or []
    if not isinstance(techniques, list) or not all(isinstance(k, str) and k for k in techniques):
        raise ConfigError(f"profile {name!r}: techniques must be a list of catalog keys, got {short(techniques)}")
    twice = sorted({k for k in techniques if techniques.count(k) > 1})
    if twice:
        raise ConfigError(f"profile {name!r}: techniques names {_choices(twice)} more than once; name each key once")
    if check_runtime:
        check_device(name, raw["device"], raw["dtype"])
    return Profile(**dict(raw, name=name, batch_sizes=tuple(sizes), guidance_scale=float(raw["guidance_scale"]),
                          notes=tuple(notes), techniques=tuple(techniques)))
