"""The converged fp32 solve: what every technique's quality on the reference model is judged against (issue 31).

A sampler's picture is a numerical solution of the model's probability-flow ODE from the image's noise; fp32
PLMS at 50 steps (the seeds' setting) is one such solve, and at guidance 7.5 on the reference model not a converged
one (it sits points of adherence below the same model solved to convergence). Judged against it, any technique that
changes the sampler "gains" that deficit for free. So the reference here is the same fp32 model's solution run to
convergence: DPM-Solver++(2M) at N steps, N the first count in LADDER at which doubling the steps moves the final
latents (mean squared error per element, the DPM-Solver papers' measure) by less than SHARE of the fastest judged
candidate's distance from the doubled solve. The check is stored with its numbers (`Convergence.rows`), so a reader
sees why N is enough.

Solves are pure functions of the model's files, the captions, the noise seeds, the guidance, the solver and its
steps: they are cached on disk under a key of exactly those (`Solver.key`), one file per chunk of CHUNK images, so
a later run (or a longer one) reuses what an earlier one computed, and a run says how many it read back.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

SOLVER = "dpmpp-2m"
LADDER = (25, 50, 100, 200, 400)  # step counts tried in turn; each is checked against its double
SHARE = 0.05  # doubling must move the latents by less than 5% of the fastest candidate's distance (issue 31)
CHECK_IMAGES = 64  # captions the convergence check solves at every count (the judged set's first ones)
CHUNK = 64  # images per cache file
CALLS = "one unpadded call per chunk"  # how a chunk is rendered: part of its key (batch size moves the last bits)


def latent_mse(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Per image, the mean squared difference of two sets of final latents (float64)."""
    if a.shape != b.shape:
        raise ValueError(f"latents to compare need equal shapes, got {tuple(a.shape)} and {tuple(b.shape)}")
    return ((a.double() - b.double()) ** 2).flatten(1).mean(1).numpy()


@dataclass
class Solve:
    """Final latents (float32, NCHW) and their decoded uint8 NHWC images, in caption order."""

    latents: torch.Tensor
    images: np.ndarray

    def __len__(self) -> int:
        return len(self.images)

    def take(self, n: int) -> "Solve":
        return Solve(self.latents[:n], self.images[:n])

    @staticmethod
    def cat(parts: list["Solve"]) -> "Solve":
        return Solve(torch.cat([p.latents for p in parts]), np.concatenate([p.images for p in parts]))


# (sampler name, steps, captions, seeds) -> Solve: how a solve is rendered (the reference model, fp32, guidance fixed)
Render = Callable[[str, int, list[str], list[int]], Solve]


def cache_dir(scratch: Path) -> Path:
    """The reference model's solves cache under a profile's scratch folder, shared by 12's curve and every judged
    technique's reference (its keys hold the model's hash: another model never reads these)."""
    return Path(scratch) / "reference-techniques" / "converged"


@dataclass
class Solver:
    """Cached fp32 solves of one model at one guidance. `render` makes the images; `model_hash` names the model's
    files (a different model never reads another's solves)."""

    render: Render
    model_hash: str
    guidance: float
    cache: Path | None = None
    hits: int = field(default=0)  # images read back from the cache in this process
    made: int = field(default=0)  # images solved here

    def key(self, sampler: str, steps: int, captions: list[str], seeds: list[int]) -> str:
        what = json.dumps({"model": self.model_hash, "guidance": float(self.guidance), "sampler": sampler,
                           "steps": int(steps), "captions": list(captions), "seeds": [int(s) for s in seeds],
                           "calls": CALLS})
        return hashlib.sha256(what.encode()).hexdigest()[:32]

    def solve(self, captions: list[str], seeds: list[int], steps: int, sampler: str = SOLVER) -> Solve:
        """The solves of these captions, chunk by chunk from the cache where present, rendered and stored where not."""
        if len(captions) != len(seeds):
            raise ValueError(f"{len(captions)} captions but {len(seeds)} seeds")
        parts = []
        for i in range(0, len(captions), CHUNK):
            c, s = captions[i:i + CHUNK], seeds[i:i + CHUNK]
            parts.append(self._chunk(sampler, steps, c, s))
        return Solve.cat(parts)

    def _chunk(self, sampler: str, steps: int, captions: list[str], seeds: list[int]) -> Solve:
        path = self.cache / f"{self.key(sampler, steps, captions, seeds)}.npz" if self.cache else None
        if path is not None and path.exists():
            with np.load(path) as f:
                got = Solve(torch.from_numpy(f["latents"]), f["images"])
            if len(got) == len(captions):
                self.hits += len(got)
                return got
        got = self.render(sampler, steps, captions, seeds)
        self.made += len(got)
        if path is not None:
            store(path, got)
        return got


def store(path: Path, solve: Solve, **extra: np.ndarray) -> None:
    """Written whole or not at all (a temp file renamed into place): a killed run leaves no torn cache entry.
    `extra` arrays are stored beside the latents and images (sdperf.reference.renders keeps a build's facts)."""
    import io

    from sdperf.store.results import atomic_write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, latents=solve.latents.numpy(), images=solve.images, **extra)
    atomic_write_bytes(path, buf.getvalue())


@dataclass
class Convergence:
    """The step count chosen and the check behind it: one row per count tried."""

    steps: int
    converged: bool
    fastest: str  # the candidate whose distance sets the tolerance, as "sampler@steps"
    rows: list[dict]

    def text(self) -> str:
        last = self.rows[-1]
        how = (f"doubling {self.steps} -> {2 * self.steps} steps moves the latents by {last['moved_mse']:.2e} "
               f"(MSE), {last['share']:.1%} of {self.fastest}'s distance {last['fastest_mse']:.2e} "
               f"(< {SHARE:.0%})") if self.converged else \
            (f"not converged by {self.steps} steps: doubling still moves the latents by {last['share']:.1%} of "
             f"{self.fastest}'s distance (>= {SHARE:.0%})")
        return f"{SOLVER} {self.steps} steps: {how}, on {last['n_images']} images"


def converge(solver: Solver, captions: list[str], seeds: list[int], fastest: tuple[str, int],
             ladder: tuple[int, ...] = LADDER, share: float = SHARE) -> Convergence:
    """The first count N in `ladder` whose solve moves by less than `share` of the fastest candidate's distance
    when the steps are doubled: both distances measured against the doubled solve, on these captions."""
    name, fast_steps = fastest
    fast = solver.solve(captions, seeds, fast_steps, sampler=name)
    rows = []
    for n in ladder:
        a, b = solver.solve(captions, seeds, n), solver.solve(captions, seeds, 2 * n)
        moved, dist = float(latent_mse(a.latents, b.latents).mean()), float(latent_mse(fast.latents, b.latents).mean())
        rows.append(dict(steps=n, doubled=2 * n, moved_mse=moved, fastest_mse=dist,
                         share=moved / dist if dist > 0 else float("inf"), n_images=len(captions)))
        if dist > 0 and moved < share * dist:
            return Convergence(n, True, f"{name}@{fast_steps}", rows)
    return Convergence(ladder[-1], False, f"{name}@{fast_steps}", rows)


def model_hash(manifest: dict) -> str:
    """One name for a model's files: the sha256 of its manifest's file list (each file's own sha256)."""
    files = manifest.get("files") or {}
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:32]
