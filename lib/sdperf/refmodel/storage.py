"""Where the trained reference model lives, how it is written, and how a reader checks it is what was trained.

`models/reference/` is a diffusers folder (a profile's `weights:` can name it) plus `evaluator/` and `manifest.json`
(every file's sha256, and the command, commit, versions, machine, recipe, times and judgement that made them).
Weights are stored in float16 and load as float32; every figure is about those stored weights.
"""
from __future__ import annotations

import copy
import datetime as _dt
import json
import platform
from pathlib import Path

import torch

from sdperf.core.errors import ConfigError
from sdperf.core.paths import REPO_ROOT
from sdperf.refmodel import loop
from sdperf.refmodel import manifest as _manifest
from sdperf.refmodel.evaluator import Evaluator

MANIFEST = _manifest.MANIFEST
sha256 = _manifest.sha256
EVALUATOR_DIR = "evaluator"
STORED_DTYPE = torch.float16


def default_dir() -> Path:
    return REPO_ROOT / "models" / "reference"


def save_pipeline(pipe, out: Path) -> None:
    """The pipeline as a diffusers folder, weights in STORED_DTYPE (the pipeline itself is left as it was)."""
    copy.deepcopy(pipe).to(dtype=STORED_DTYPE).save_pretrained(str(out), safe_serialization=True)


def save_evaluator(trained, out: Path, seed: int, steps: int) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in trained.net.state_dict().items()}, str(out / "evaluator.safetensors"))
    loop.save_json(out / "evaluator.json", {"resolution": trained.net.resolution, "seed": seed, "steps": steps,
                                            "accuracy": trained.accuracy, "n_held_out": trained.n_held_out,
                                            "curve": trained.curve})


def load_evaluator(folder: Path) -> tuple[Evaluator, dict]:
    """(evaluator in eval mode, its record: resolution, accuracy on held-out renders, training curve)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = json.loads((folder / "evaluator.json").read_text())
    net = Evaluator(meta["resolution"])
    net.load_state_dict(load_file(str(folder / "evaluator.safetensors")))
    return net.eval().requires_grad_(False), meta


def provenance(command: str) -> dict:
    from sdperf.core import environment

    return {"command": command, "commit": environment.git_commit(),
            "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "versions": {"python": platform.python_version(),
                         **environment.package_versions(("torch", "diffusers", "transformers", "numpy", "pillow"))},
            "machine": {"cpu_model": environment.cpu_model(), "fingerprint": environment.fingerprint(),
                        "threads": torch.get_num_threads()}}


def write_manifest(out: Path, record: dict) -> dict:
    """Hash every file under `out` into the record and write it last: a folder with a manifest is complete."""
    out = Path(out)
    manifest = dict(record, files=_manifest.write_files(out))
    loop.save_json(out / MANIFEST, manifest)
    return manifest


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ConfigError(f"no reference model at {str(folder)!r} (no {MANIFEST}); build it with "
                          "`sdperf train-reference` (about 45 minutes on 2 cores)")
    return _manifest.read(folder)


def verify(folder: Path) -> dict:
    """The manifest, after sdperf.refmodel.manifest.verify; a folder without one is told how to build it."""
    folder = Path(folder)
    read_manifest(folder)
    return _manifest.verify(folder)


def load(folder: Path | None = None, scheduler: str | None = "plms"):
    """(pipeline, evaluator, manifest) of the verified reference model; `scheduler` None: no pipeline (None)."""
    from sdperf.model.pipelines import build_from_weights

    folder = Path(folder or default_dir())
    manifest = verify(folder)
    net, _ = load_evaluator(folder / EVALUATOR_DIR)
    return (build_from_weights(str(folder), scheduler) if scheduler else None), net, manifest
