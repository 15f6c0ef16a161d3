"""A judged technique's renders on the reference model, cached on disk across runs of one machine.

A batch is a pure function of the model's files, the key, the code that builds and runs it (CODE, by content), the
libraries, steps, guidance, captions, noise seeds, call shape and the machine (int8 kernels differ between CPUs),
and is stored whole under a key of exactly those. The controls are never cached: they check this run's rendering.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sdperf.core.errors import ConfigError
from sdperf.judge.converged import Solve, read, store
from sdperf.optimizations.catalog import Stack

# the code a render runs, relative to the sdperf package: a change to any of these files is a new key
CODE = ("optimizations", "model", "imagegen/render.py", "refmodel/domain_quality.py", "judge/technique_setup.py",
        "refmodel/sdref.py", "refmodel/storage.py", "refmodel/student_command.py", "refmodel/distillation.py",
        "config/architectures.py")
# the libraries every render runs on, beside a technique's own (Technique.packages): a new version is a new key
LIBRARIES = ("torch", "diffusers", "transformers", "numpy")


def cache_dir(scratch: Path) -> Path:
    """Beside the converged solves' cache under a profile's scratch folder (sdperf.judge.converged)."""
    return Path(scratch) / "reference-techniques" / "renders"


@functools.cache
def code_hash() -> str:
    """sha256 over the contents of CODE's .py files, in path order."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for part in CODE:
        p = root / part
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:32]


@functools.cache
def library_versions(key: str = "") -> dict:
    """The versions of LIBRARIES and of the packages the techniques of `key` import (a control's key names none)."""
    try:
        own = tuple(p for t in Stack.of(key).techniques for p in t.packages)
    except ConfigError:
        own = ()
    out = {}
    for name in dict.fromkeys(LIBRARIES + own):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


@dataclass
class Cache:
    """The renders of one technique (`key`) of one model on one machine. `folder` None: nothing is read or stored."""

    folder: Path | None
    model_hash: str
    machine: str
    key: str
    steps: int
    guidance: float
    call: dict  # how the pipeline is called: prompts per call, padding, grad mode
    facts: dict = field(default_factory=dict)  # the build's facts (catalog.Context.facts): stored, and filled on a hit
    hits: int = field(default=0)  # images read back in this process

    def name(self, captions: list[str], seeds: list[int]) -> str:
        what = json.dumps({"model": self.model_hash, "machine": self.machine, "key": self.key,
                           "code": code_hash(), "libraries": library_versions(self.key), "steps": int(self.steps),
                           "guidance": float(self.guidance), "call": self.call, "captions": list(captions),
                           "seeds": [int(s) for s in seeds]}, sort_keys=True)
        return hashlib.sha256(what.encode()).hexdigest()[:32]

    def _path(self, captions: list[str], seeds: list[int]) -> Path | None:
        return self.folder / f"{self.name(captions, seeds)}.npz" if self.folder is not None else None

    def get(self, captions: list[str], seeds: list[int]) -> Solve | None:
        """The batch when stored whole for these captions and seeds; its build's facts fill in what `facts` lacks."""
        path = self._path(captions, seeds)
        if path is None:
            return None
        got, extra = read(path, len(captions))  # damaged, unsealed or not whole: set aside and rendered again
        if got is None:
            return None
        try:
            facts = json.loads(str(extra["facts"]))
        except (KeyError, ValueError):
            facts = {}
        self.hits += len(got)
        for k, v in facts.items():
            self.facts.setdefault(k, v)
        return got

    def put(self, captions: list[str], seeds: list[int], solve: Solve) -> None:
        """Stored whole or not at all (sdperf.judge.converged.store), with the build's facts."""
        path = self._path(captions, seeds)
        if path is not None:
            store(path, solve, facts=np.array(json.dumps(self.facts, default=str)))
