"""The catalog: every technique the study measures, declared once in its own module and found here by key.

A module declares its techniques (`techniques()` lists its canonical keys, `technique(arg)` builds a parametric one
such as `compile:<spec>`); everything names them by key, never by label. A configuration is a stack of keys applied
in order to a fresh fp32 pipeline in a worker process of its own; its key is its keys joined by '+'.
"""
from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from sdperf.core.errors import ConfigError

# Families: what part of a generation a technique changes; a stack holds at most one technique of each
GRAD_MODE, PARAMETERS, PRECISION, ATTENTION = "grad mode", "parameters", "precision", "attention"
EXECUTOR, GRAPHS, SCHEDULER, ALLOCATOR = "unet executor", "graphs", "scheduler", "allocator"
CACHING, MERGING = "feature caching", "token merging"  # both patch the PyTorch UNet's blocks: not after an executor
PATCH_BLOCKS = (CACHING, MERGING)  # ... and not under an engine that traces the UNet (Technique.traces_unet)
STAGES = "vae and text encoder executor"  # the two stages around the loop, run by an engine
CALIBRATION = "calibration"  # a technique of known cost that checks the method itself
# What CPU users deploy: a distilled UNet (guidance folded in; LCM with its own sampler), a tiny VAE decoder, a cut
# of classifier-free guidance. A guidance cut needs the two-call guidance a distilled UNet no longer makes.
DISTILLED, DECODER, GUIDANCE = "distilled UNet", "decoder", "guidance cut"
FAMILIES = (GRAD_MODE, PARAMETERS, PRECISION, ATTENTION, EXECUTOR, GRAPHS, SCHEDULER, CACHING, MERGING, ALLOCATOR,
            STAGES, CALIBRATION, DISTILLED, DECODER, GUIDANCE)
# Families that cannot share a stack, and why (Stack.of)
EXCLUSIVE = {
    frozenset((DISTILLED, GUIDANCE)): "a distilled UNet folds guidance into one call per step: there is no "
                                      "unconditional call left to cut",
    frozenset((DECODER, STAGES)): "both replace the VAE decoder",
    frozenset((DISTILLED, EXECUTOR)): "the engines export and quantize the UNet's call without the guidance input",
}

# A module of this package declares techniques when it defines a top-level techniques() (catalog.modules)
DECLARES = re.compile(r"^def techniques\(\)", re.M)
STACK_SEP = "+"
BASELINE_KEY = "fp32-eager"  # the empty stack: the profile's pipeline in fp32, inference_mode, as built


@dataclass
class Context:
    """What a technique may read while it is applied: the profile, the workload's batch, a `scratch` folder kept
    between worker processes, `artefacts` (this comparison's engines), and `facts`, where apply() leaves what it
    found. `prompts`: the captions a calibrating technique collects activations from (empty: the profile's);
    `calibration_samples`: the most UNet calls it collects (None: its own default)."""

    profile: Any  # sdperf.config.profiles.Profile
    batch_size: int = 1
    scratch: Path | None = None
    artefacts: Path | None = None
    facts: dict = field(default_factory=dict)
    prompts: tuple[str, ...] = ()
    calibration_samples: int | None = None

    @property
    def device(self) -> str:
        return self.profile.device

    def workload(self, steps: int | None = None):
        from sdperf.model.generation import Workload

        return Workload.from_profile(self.profile, batch_size=self.batch_size, steps=steps)


def _unchanged(pipe, _ctx: Context):
    return pipe


def _everywhere(_ctx: Context) -> tuple[bool, str]:
    return True, "runs everywhere torch does"


@dataclass(frozen=True)
class Technique:
    """One optimization: how to apply it to a pipeline, whether it can run here, and what it may change.

    `changes_output`: it may move the image away from fp32 eager on the same seed (a lossless one that does is a
    bug the drift rows show). `allocator` is a process setting the worker is started under. `loop_only`: it changes
    the denoising loop only, so its worker times generations without the VAE decode and adds the baseline's.
    `call_kinds`: for UNet calls that do not all cost the same (feature caching), a function from the loop's
    timesteps to each call's kind ("full", "cached"), timed apart and composed at other step counts. `calibrated`:
    it is built from generations of Context.prompts, so it depends on Context.calibration_samples too."""

    key: str
    label: str
    family: str
    notebook: str
    apply: Callable[[Any, Context], Any] = _unchanged
    availability: Callable[[Context], tuple[bool, str]] = _everywhere
    changes_output: bool = False
    dtype: str = "float32"
    grad_mode: str | None = None
    steps: int | None = None
    sampler: str | None = None  # a scheduler's '<scheduler>[:<spacing>]' (sdperf.model.pipelines.parse_sampler)
    allocator: str | None = None
    loop_only: bool = False
    note: str = ""
    call_kinds: Callable[[list], list[str]] | None = None
    # What the field uses instead when this technique alone is over the quality budget (judge.techniques.for_study)
    fallbacks: tuple[str, ...] = ()
    calibrated: bool = False
    # Runs an exported trace of the UNet, into which block patches (PATCH_BLOCKS) would be frozen (Stack.of)
    traces_unet: bool = False
    # What a verdict on the reference model says about SD 1.5: (in a few words, why); required if changes_output
    transfer: tuple[str, str] | None = None
    # Extra copies of each network it holds beside the eager ones, for the memory estimate (sdperf.measure.memory)
    extra_copies: dict = field(default_factory=dict, hash=False)
    # The distributions it imports beyond torch and diffusers: recorded in rows and in its cached renders' key
    packages: tuple[str, ...] = ()
    # The kernel whose measured roof bounds its UNet matmuls (sdperf.measure.roofline); None: not a matmul executor
    roof_kernel: str | None = None
    # Its sampler is part of it (a consistency student's): a scheduler technique cannot replace it in a stack
    owns_sampler: bool = False

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"technique {self.key!r}: family {self.family!r} is not one of {', '.join(FAMILIES)}")
        if self.changes_output and self.transfer is None:
            raise ValueError(f"technique {self.key!r} may change the output but does not say whether its quality "
                             "verdict transfers to SD 1.5 (Technique.transfer)")


@functools.cache
def modules() -> tuple[str, ...]:
    """The modules that declare techniques, read from this package's sources, by owning notebook, then name."""
    here = Path(__file__).resolve().parent
    found = [p.stem for p in sorted(here.glob("*.py")) if DECLARES.search(p.read_text())]
    return tuple(sorted(found, key=lambda n: getattr(_module(n), "NOTEBOOK", "") or _module(n).techniques()[0].notebook))


@functools.cache
def _declared() -> dict[str, Technique]:
    out: dict[str, Technique] = {}
    for name in modules():
        for tech in _module(name).techniques():
            if tech.key in out:
                raise RuntimeError(f"technique {tech.key!r} is declared twice ({out[tech.key].notebook}, {name})")
            out[tech.key] = tech
    return out


def _module(name: str):
    return importlib.import_module(f"sdperf.optimizations.{name}")


def _prefixes() -> dict[str, str]:
    """'compile' -> 'torch_compile': the module that builds parametric keys of a prefix."""
    out = {}
    for name in modules():
        mod = _module(name)
        for prefix in getattr(mod, "KEY_PREFIXES", ()):
            out[prefix] = name
    return out


def packages() -> tuple[str, ...]:
    """Every distribution a technique may import (Technique.packages, a parametric module's PACKAGES), in order."""
    out = [p for t in _declared().values() for p in t.packages]
    for name in modules():
        mod = _module(name)
        if getattr(mod, "KEY_PREFIXES", ()):
            out += getattr(mod, "PACKAGES", ())
    return tuple(dict.fromkeys(out))


def keys(notebook: str | None = None, family: str | None = None) -> list[str]:
    """The canonical keys, optionally those one notebook owns or of one family, in declaration order."""
    return [k for k, t in _declared().items()
            if (notebook is None or t.notebook == notebook) and (family is None or t.family == family)]


def get(key: str) -> Technique:
    """The technique of `key`; an unknown key is a ConfigError that names the valid keys."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"technique key {key!r} is empty; valid techniques: {', '.join(keys())}")
    found = _declared().get(key)
    if found is not None:
        return found
    prefix, sep, arg = key.partition(":")
    owner = _prefixes().get(prefix) if sep else None
    if owner is not None:
        try:
            return _module(owner).technique(prefix, arg)
        except ValueError as exc:
            raise ConfigError(f"technique {key!r}: {exc}") from None
    raise ConfigError(f"unknown technique {key!r}; valid techniques: {', '.join(keys())}"
                      + (f"; parametric: {', '.join(p + ':<...>' for p in _prefixes())}" if _prefixes() else ""))


def among(techniques, notebook: str | None = None, families=(), lossy: bool | None = None) -> list[str]:
    """The keys of a profile's technique list that belong to `notebook` (a stack: its first key's), of one of
    `families`, changing the output or not (`lossy`), in the list's order."""
    out = []
    for key in techniques:
        stack = Stack.of(key)
        first = stack.techniques[0] if stack.techniques else None
        if first is None or (notebook is not None and first.notebook != notebook):
            continue
        if families and first.family not in families:
            continue
        if lossy is not None and stack.changes_output != lossy:
            continue
        out.append(key)
    return out


def split(stack_key: str) -> tuple[str, ...]:
    """'engine:openvino-f32+scheduler:dpmpp-2m@20' -> its keys; the baseline key is the empty stack."""
    if stack_key in ("", BASELINE_KEY):
        return ()
    out: list[str] = []
    for part in stack_key.split(STACK_SEP):
        # a compile spec joins its flags with '+' too: a segment neither prefixed nor canonical continues a key
        if out and ":" not in part and part not in _declared():
            out[-1] += STACK_SEP + part
        else:
            out.append(part)
    return tuple(out)


def join(stack: tuple[str, ...] | list[str]) -> str:
    return STACK_SEP.join(stack) if stack else BASELINE_KEY


def trace_conflict(techs) -> tuple[list[str], list[str]]:
    """(the engines that run a trace of the UNet, the techniques that patch its blocks in Python) among `techs`:
    a stack holds one side or the other, never both (Stack.of; the ladder's best order chooses a side)."""
    return [t.key for t in techs if t.traces_unet], [t.key for t in techs if t.family in PATCH_BLOCKS]


@dataclass(frozen=True)
class Stack:
    """Techniques applied in order to one fp32 pipeline; the last precision, grad mode and step count win."""

    techniques: tuple[Technique, ...]

    @classmethod
    def of(cls, stack_key: str | tuple[str, ...] | list[str]) -> "Stack":
        ks = split(stack_key) if isinstance(stack_key, str) else tuple(stack_key)
        techs = tuple(get(k) for k in ks)
        fams = [t.family for t in techs]
        twice = sorted({f for f in fams if fams.count(f) > 1})
        if twice:
            raise ConfigError(f"stack {join(ks)!r} has more than one technique of family {', '.join(twice)}: "
                              "stack at most one of each (one UNet executor, one precision, one scheduler, ...)")
        for pair, why in EXCLUSIVE.items():
            both = [t for t in techs if t.family in pair]
            if len({t.family for t in both}) == 2:
                raise ConfigError(f"stack {join(ks)!r}: {' and '.join(t.key for t in both)} cannot stack: {why}")
        owner = next((t.key for t in techs if t.owns_sampler), None)
        other = [t.key for t in techs if t.family == SCHEDULER]
        if owner and other:
            raise ConfigError(f"stack {join(ks)!r}: {owner} samples with its own sampler and step count, which "
                              f"{other[0]} would replace; give its step count in its key instead")
        traced, patched = trace_conflict(techs)
        if traced and patched:
            raise ConfigError(f"stack {join(ks)!r}: {', '.join(patched)} patches the PyTorch UNet's blocks in Python "
                              f"and {traced[0]} runs an exported trace of the UNet, which would freeze that Python "
                              f"into one branch; stack {', '.join(patched)} with eager, compiled or module-swapped "
                              "UNets only")
        return cls(techs)

    @property
    def key(self) -> str:
        return join([t.key for t in self.techniques])

    @property
    def label(self) -> str:
        return " + ".join(t.label for t in self.techniques) or "fp32 eager"

    def _last(self, attr: str, default):
        return next((getattr(t, attr) for t in reversed(self.techniques) if getattr(t, attr) not in (None, "float32")),
                    default)

    @property
    def dtype(self) -> str:
        return self._last("dtype", "float32")

    @property
    def grad_mode(self) -> str:
        return self._last("grad_mode", "inference_mode")

    @property
    def steps(self) -> int | None:
        return self._last("steps", None)

    @property
    def sampler(self) -> str | None:
        """The stack's sampler ('<scheduler>[:<spacing>]'), None when it keeps the pipeline's."""
        return self._last("sampler", None)

    @property
    def allocator(self) -> str:
        return self._last("allocator", "default")

    @property
    def call_kinds(self) -> Callable[[list], list[str]] | None:
        """The pattern of UNet-call kinds of the stack's caching technique, if it has one."""
        return next((t.call_kinds for t in self.techniques if t.call_kinds is not None), None)

    @property
    def loop_only(self) -> bool:
        """Every technique changes only the denoising loop (the empty stack, the baseline, is timed whole)."""
        return bool(self.techniques) and all(t.loop_only for t in self.techniques)

    @property
    def changes_output(self) -> bool:
        return any(t.changes_output for t in self.techniques)

    @property
    def calibrated(self) -> bool:
        """A technique of the stack is built from calibration generations (Technique.calibrated)."""
        return any(t.calibrated for t in self.techniques)

    def availability(self, ctx: Context) -> tuple[bool, str]:
        """Runnable when every technique is; otherwise the first one's reason, naming it."""
        for t in self.techniques:
            ok, reason = t.availability(ctx)
            if not ok:
                return False, f"{t.key}: {reason}"
        return True, "; ".join(t.availability(ctx)[1] for t in self.techniques) or "the baseline"

    def apply(self, pipe, ctx: Context):
        for t in self.techniques:
            pipe = t.apply(pipe, ctx)
        return pipe


def with_label(tech: Technique, label: str) -> Technique:
    return replace(tech, label=label)
