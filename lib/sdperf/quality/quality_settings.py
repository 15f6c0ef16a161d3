"""The profile's `quality:` section, validated before any model is built.

Every file it names (captions, reference images, Inception and CLIP weights) is checked here, so a wrong path fails
in well under a second with the path and what was expected, not minutes later inside a model loader.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sdperf.core.errors import ConfigError
from sdperf.config.profiles import Profile

# open_clip names of the two protocols' CLIP models; "-quickgelu" is how open_clip builds OpenAI's own checkpoints
# (NeMo: OpenAI ViT-L/14; MLPerf: OpenAI ViT-B/32), which a local file of OpenAI weights needs.
CLIP_ARCHS = ("ViT-L-14", "ViT-L-14-quickgelu", "ViT-B-32", "ViT-B-32-quickgelu")
FID_FEATURES = (64, 192, 768, 2048)  # the Inception pool layers torchmetrics offers; 2048 is the standard FID
REFERENCE_SUFFIXES = (".npz",)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


@dataclass(frozen=True)
class Key:
    kind: str  # "int", "float_list", "path", "choice", "path_or_none"
    what: str  # what the value must be, for the error message
    choices: tuple = ()


KEYS = {
    "captions": Key("caption_path", "a COCO captions file (.json/.tsv/.txt) or null for the repo's smoke captions"),
    "n_images": Key("int", "an integer >= 2 (images per guidance scale; FID needs two or more)"),
    "guidance_scales": Key("float_list", "a non-empty list of guidance scales >= 1"),
    "steps": Key("int", "an integer >= 1 (denoising steps of the quality images)"),
    "score_resolution": Key("int_or_none", "an integer >= 32 (side the images are resized to) or null"),
    "reference": Key("reference", "a folder of real images or a .npz of Inception statistics, or null"),
    "inception_weights": Key("file", "a torch-fidelity Inception-v3 state dict (.pth) or null for random init"),
    "fid_features": Key("choice", "an Inception feature size", FID_FEATURES),
    "clip_arch": Key("choice", "an open_clip model name", CLIP_ARCHS),
    "clip_weights": Key("file", "an open_clip checkpoint file for clip_arch, or null for random init"),
    "ladder_n_images": Key("int", "an integer >= 2 (images per ladder rung)"),
    "score_batch": Key("int", "an integer >= 1 (images per Inception / CLIP forward)"),
    # the same protocol on the study's trained reference model (sdperf.refmodel), scored by its evaluator
    "reference_n_images": Key("int", "an integer >= 2 (reference-model images per guidance scale)"),
    "reference_guidance_scales": Key("float_list", "a non-empty list of guidance scales >= 1"),
    "reference_steps": Key("int", "an integer >= 1 (PLMS steps of the reference-model images; NeMo: 50)"),
    "reference_delta_images": Key("int", "an integer >= 2 (the most reference-model images per technique and "
                                         "guidance for its paired quality deltas, sdperf.judge.techniques)"),
    "reference_delta_step": Key("int", "an integer >= 2 (images per batch of the sequential test: more come until "
                                       "the adherence intervals settle, up to reference_delta_images)"),
    "reference_judge_guidances": Key("float_list", "a non-empty list of guidance scales >= 1 (where techniques are "
                                                   "judged against the converged solve; the first is the headline's)"),
    "reference_convergence_steps": Key("step_ladder", "an increasing list of integers >= 1 (the converged solve's "
                                                      "step counts, each checked against its double)"),
    "reference_check_images": Key("int", "an integer >= 2 (captions the convergence check solves at every count)"),
    "reference_independent_steps": Key("int", "an integer >= 2 (trailing Euler steps of the convergence check's "
                                              "independent solve, from the same noise and first timestep)"),
    "reference_key_budget_s": Key("seconds_or_none", "a number of seconds > 0, or null for no limit (the most a "
                                                     "technique's first batch may take on this machine, predicted "
                                                     "from its second call; over it the key is skipped, saying so)"),
    "reference_calibration_samples": Key("int", "an integer >= 1 (the most UNet calls a calibrated int8 technique "
                                                "collects on the reference model, in whole trajectories and at least "
                                                "one; nncf.quantize's own default subset is 300)"),
    "reference_fallbacks": Key("count_or_none", "an integer >= 0, or null for all (how many of a technique's "
                                                "alternatives, in the catalog's order, are judged when it alone is "
                                                "over the budget)"),
    "reference_noise_doses": Key("dose_list", "a non-empty list of numbers > 0 (std of the Gaussian noise the positive "
                                              "controls add to the UNet's output)"),
}


@dataclass(frozen=True)
class QualitySettings:
    """What 12_fid_clip generates and how it scores; None for a path means 'not given: use the stand-in'."""

    profile: str
    captions: Path | None
    n_images: int
    guidance_scales: tuple[float, ...]
    steps: int
    score_resolution: int | None
    reference: Path | None
    inception_weights: Path | None
    fid_features: int
    clip_arch: str
    clip_weights: Path | None
    ladder_n_images: int
    score_batch: int
    reference_n_images: int
    reference_guidance_scales: tuple[float, ...]
    reference_steps: int
    reference_delta_images: int
    reference_delta_step: int
    reference_judge_guidances: tuple[float, ...]
    reference_convergence_steps: tuple[int, ...]
    reference_check_images: int
    reference_independent_steps: int
    reference_key_budget_s: float | None
    reference_calibration_samples: int
    reference_fallbacks: int | None
    reference_noise_doses: tuple[float, ...]
    pipeline_weights: str | None

    @property
    def real_pipeline(self) -> bool:
        return self.pipeline_weights is not None

    def machinery_reasons(self, metric: str) -> list[str]:
        """Why a metric's numbers say nothing about image quality (empty when they do)."""
        out = [] if self.real_pipeline else ["random-init diffusion model"]
        if metric == "fid":
            out += [] if self.inception_weights else ["random-init Inception"]
            out += [] if self.reference else ["stand-in reference images (no real images given)"]
        elif metric == "fid_vs_baseline":
            out += [] if self.inception_weights else ["random-init Inception"]
        else:
            out += [] if self.clip_weights else [f"random-init CLIP {self.clip_arch}"]
        return out

    def label(self, metric: str) -> str:
        """Column and axis title: a number from a random network never reads like a real FID or CLIP score."""
        name = {"fid": "FID", "fid_vs_baseline": "FID vs fp32 images", "clip": "CLIP score"}[metric]
        return f"{name} [machinery only]" if self.machinery_reasons(metric) else name

    def headline(self) -> str:
        """The notebook's first output line."""
        reasons = list(dict.fromkeys(self.machinery_reasons("fid") + self.machinery_reasons("clip")))
        if reasons:
            return ("These numbers measure the machinery, not image quality: " + "; ".join(reasons) + ". "
                    "Give real weights and COCO captions (see the last section) for quality figures.")
        return (f"Quality figures from real weights: pipeline {self.pipeline_weights}, Inception "
                f"{self.inception_weights}, CLIP {self.clip_arch} {self.clip_weights}, reference {self.reference}.")


def _fail(profile: str, key: str, value, spec: Key, problem: str = "is not valid") -> ConfigError:
    choices = f"; choose one of: {', '.join(map(str, spec.choices))}" if spec.choices else ""
    return ConfigError(f"profile {profile!r}: quality.{key} {value!r} {problem}; expected {spec.what}{choices}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_positive(v) -> bool:
    """A finite number > 0 (a bool is not a number here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")


def _path(profile: str, key: str, value, spec: Key) -> Path | None:
    """An existing file or folder, or None; relative paths are taken from the working directory."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _fail(profile, key, value, spec)
    path = Path(value).expanduser()
    if spec.kind == "reference":
        if path.is_dir():
            if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.iterdir()):
                raise _fail(profile, key, value, spec, f"is a folder without images ({', '.join(IMAGE_SUFFIXES)})")
            return path
        if path.suffix.lower() not in REFERENCE_SUFFIXES:
            raise _fail(profile, key, value, spec, "is neither an image folder nor a .npz file")
    if not path.exists():
        raise _fail(profile, key, value, spec, "does not exist")
    if spec.kind in ("file", "reference", "caption_path") and not path.is_file():
        raise _fail(profile, key, value, spec, "is not a file")
    return path


_AT_LEAST_TWO = ("n_images", "ladder_n_images", "reference_n_images", "reference_delta_images", "reference_delta_step",
                 "reference_check_images", "reference_independent_steps")


def _value(profile: str, key: str, value, spec: Key):
    kind, v = spec.kind, value
    valid = {"int": lambda: _is_int(v) and v >= (2 if key in _AT_LEAST_TWO else 1),
             "int_or_none": lambda: v is None or (_is_int(v) and v >= 32),
             "float_list": lambda: isinstance(v, list) and bool(v) and all(
                 isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 1 for x in v),
             "count_or_none": lambda: v is None or (_is_int(v) and v >= 0),
             "seconds_or_none": lambda: v is None or _is_positive(v),
             "step_ladder": lambda: isinstance(v, list) and bool(v) and all(_is_int(x) and x >= 1 for x in v) and all(
                 b > a for a, b in zip(v, v[1:])),
             "dose_list": lambda: isinstance(v, list) and bool(v) and all(_is_positive(x) for x in v),
             "choice": lambda: v in spec.choices}.get(kind)
    if valid is None:
        return _path(profile, key, value, spec)
    if not valid():
        raise _fail(profile, key, value, spec)
    if kind == "float_list" and len(set(v)) != len(v):
        raise _fail(profile, key, value, spec, "repeats a scale")
    if kind in ("float_list", "dose_list"):
        return tuple(float(x) for x in v)
    if kind == "step_ladder":
        return tuple(v)
    return float(v) if kind == "seconds_or_none" and v is not None else v


def settings(profile: Profile) -> QualitySettings:
    """The validated quality section; unknown or missing keys name the valid ones."""
    raw = dict(profile.quality or {})
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ConfigError(f"profile {profile.name!r}: unknown quality key(s) {', '.join(map(repr, unknown))}; "
                          f"valid keys: {', '.join(KEYS)}")
    missing = [k for k in KEYS if k not in raw]
    if missing:
        raise ConfigError(f"profile {profile.name!r}: the quality section lacks {', '.join(missing)}; "
                          f"it needs every one of: {', '.join(KEYS)}")
    values = {k: _value(profile.name, k, raw[k], spec) for k, spec in KEYS.items()}
    if values["reference_delta_step"] > values["reference_delta_images"]:
        raise _fail(profile.name, "reference_delta_step", values["reference_delta_step"], KEYS["reference_delta_step"],
                    f"exceeds reference_delta_images ({values['reference_delta_images']})")
    if values["captions"] is not None:  # a malformed captions file fails now too, naming the path
        from sdperf.model.prompts import load_captions

        load_captions(values["captions"])
    return QualitySettings(profile=profile.name, pipeline_weights=profile.weights, **values)
