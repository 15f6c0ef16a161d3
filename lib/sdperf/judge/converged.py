"""The converged fp32 solve: what every technique's quality on the reference model is judged against.

A sampler's picture solves the model's probability-flow ODE from the image's noise; fp32 PLMS-50 (the seeds'
setting) is not converged at guidance 7.5, so judged against it any technique that changes the sampler "gains"
that deficit for free. The reference is the model's solution run to convergence from where the noise is:
DPM-Solver++(2M) on Karras et al.'s noise levels (SOLVER), from t=999 to t=0 whatever the scheduler config says
(leading spacing never starts at the noise's level; trailing spacing's last step shrinks only as fast as 1/N).

N is the first count in LADDER whose two checks land within SHARE of the fastest judged candidate's distance: the
solve at 2N moves the final latents (MSE per element) by less than that, and an independent solver (INDEPENDENT,
another family on another grid: doubling alone is fooled by a start or an end both solves share) lands within that
of the solve at N. Both are stored (`Convergence.rows`). Solves are cached on disk (`Solver.key`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from sdperf.model.pipelines import sampler_key, timestep_span

SOLVER = "dpmpp-2m:karras"  # the converged solve's sampler (sdperf.model.pipelines.parse_sampler): t 999 -> 0
INDEPENDENT = "euler:trailing"  # the independent leg's sampler: another family and grid, the same first timestep
INDEPENDENT_STEPS = 400  # its steps where a profile names none (quality.reference_independent_steps)
FORMER = ("dpmpp-2m", 25)  # the earlier reference: the model's leading spacing, from t=951
LADDER = (25, 50, 100, 200, 400)  # step counts tried in turn; each is checked against its double
SHARE = 0.05  # each check must land within 5% of the fastest candidate's distance
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

    def problem(self, n: int) -> str | None:
        """Why this solve, read back from a cache, is not `n` whole finite images of the render's dtypes, or None."""
        lat, img = self.latents, self.images
        if lat.dtype != torch.float32 or lat.ndim != 4 or img.dtype != np.uint8 or img.ndim != 4 or img.shape[-1] != 3:
            return (f"it holds latents {lat.dtype} {tuple(lat.shape)} and images {img.dtype} {tuple(img.shape)}, not "
                    "float32 NCHW latents and uint8 NHWC RGB images")
        if len(lat) != n or len(img) != n:
            return f"it holds {len(lat)} latents and {len(img)} images, not {n}"
        if not bool(torch.isfinite(lat).all()):
            return "its latents hold NaN or inf"
        return None

    def take(self, n: int) -> "Solve":
        return Solve(self.latents[:n], self.images[:n])

    @staticmethod
    def cat(parts: list["Solve"]) -> "Solve":
        return Solve(torch.cat([p.latents for p in parts]), np.concatenate([p.images for p in parts]))


# (sampler name, steps, captions, seeds) -> Solve: how a solve is rendered (the reference model, fp32, guidance fixed)
Render = Callable[[str, int, list[str], list[int]], Solve]


def cache_dir(scratch: Path) -> Path:
    """The reference model's solves cache under a profile's scratch folder, shared by 12's curve and the judging."""
    return Path(scratch) / "reference-techniques" / "converged"


@dataclass
class Solver:
    """Cached fp32 solves of one model at one guidance; `schedule`: the noise-schedule config `span` reads."""

    render: Render
    model_hash: str
    guidance: float
    cache: Path | None = None
    schedule: dict | None = None
    hits: int = field(default=0)  # images read back from the cache in this process
    made: int = field(default=0)  # images solved here

    def span(self, sampler: str, steps: int) -> tuple[int | None, int | None]:
        """(first, last) timestep the sampler calls the UNet at; (None, None) without a schedule."""
        return timestep_span(sampler, steps, self.schedule) if self.schedule is not None else (None, None)

    def key(self, sampler: str, steps: int, captions: list[str], seeds: list[int]) -> str:
        what = json.dumps({"model": self.model_hash, "guidance": float(self.guidance), "sampler": sampler,
                           "steps": int(steps), "captions": list(captions), "seeds": [int(s) for s in seeds],
                           "calls": CALLS})
        return hashlib.sha256(what.encode()).hexdigest()[:32]

    def solve(self, captions: list[str], seeds: list[int], steps: int, sampler: str = SOLVER) -> Solve:
        """The solves of these captions, chunk by chunk from the cache where present, rendered and stored where not."""
        if len(captions) != len(seeds):
            raise ValueError(f"{len(captions)} captions but {len(seeds)} seeds")
        return Solve.cat([self._chunk(sampler, steps, captions[i:i + CHUNK], seeds[i:i + CHUNK])
                          for i in range(0, len(captions), CHUNK)])

    def _chunk(self, sampler: str, steps: int, captions: list[str], seeds: list[int]) -> Solve:
        path = self.cache / f"{self.key(sampler, steps, captions, seeds)}.npz" if self.cache else None
        got = read(path, len(captions))[0] if path is not None else None
        if got is not None:
            self.hits += len(got)
            return got
        got = self.render(sampler, steps, captions, seeds)
        self.made += len(got)
        if path is not None:
            store(path, got)
        return got


def read(path: Path, n: int) -> tuple[Solve | None, dict]:
    """(the solve of `n` images at `path`, the extra arrays stored with it), or (None, {}) if none or not whole."""
    from sdperf.store import verified

    def load(p):
        with np.load(p, allow_pickle=False) as f:
            return Solve(torch.from_numpy(f["latents"]), f["images"]), {k: f[k] for k in f.files
                                                                         if k not in ("latents", "images")}

    got = verified.load(path, load, expect=lambda v: v[0].problem(n))
    return got if got is not None else (None, {})


def store(path: Path, solve: Solve, **extra: np.ndarray) -> bool:
    """Written whole or not at all and sealed (sdperf.store.verified.write), `extra` arrays beside the latents."""
    from sdperf.store import verified

    return verified.write(path, lambda tmp: _savez(tmp, latents=solve.latents.numpy(), images=solve.images, **extra))


def _savez(path: str, **arrays: np.ndarray) -> None:
    with open(path, "wb") as fh:  # a file object: np.savez would add '.npz' to a temp name without it
        np.savez(fh, **arrays)


@dataclass
class Convergence:
    """The step count chosen and the checks behind it: one row per count tried, each with both legs."""

    steps: int
    converged: bool
    fastest: str  # the candidate whose distance sets the tolerance, as "sampler@steps[:spacing]"
    rows: list[dict]
    independent: str = ""  # the independent leg's solve, as "sampler@steps[:spacing]"
    former: dict | None = None  # FORMER's distance to the independent solve: mse, share, span
    sampler: str = SOLVER  # the sampler checked

    def text(self) -> str:
        last = self.rows[-1]
        at = sampler_key(self.sampler, self.steps) + ("" if last.get("first_timestep") is None else
                                                      f" (t {_span(last)})")
        legs = (f"doubling to {last['doubled']} steps moves the latents by {last['moved_mse']:.2e} (MSE), "
                f"{last['share']:.1%} of {self.fastest}'s distance; the independent {self.independent} solve is "
                f"{last['independent_mse']:.2e} away, {last['independent_share']:.1%} of {self.fastest}'s distance "
                f"to it")
        verdict = f"converged (both < {SHARE:.0%})" if self.converged else \
            f"NOT converged by {self.steps} steps (each must be < {SHARE:.0%})"
        return f"{at}: {legs}: {verdict}, on {last['n_images']} images"


def _span(row: dict) -> str:
    first, last = row.get("first_timestep"), row.get("last_timestep")
    return "?" if first is None else f"{first} -> {last}"


def converge(solver: Solver, captions: list[str], seeds: list[int], fastest: tuple[str, int],
             ladder: tuple[int, ...] = LADDER, share: float = SHARE,
             independent: tuple[str, int] = (INDEPENDENT, INDEPENDENT_STEPS),
             former: tuple[str, int] | None = FORMER, sampler: str = SOLVER) -> Convergence:
    """The first count N in `ladder` at which both legs hold (see the module), else the last, not converged."""
    name, fast_steps = fastest
    fast = solver.solve(captions, seeds, fast_steps, sampler=name)
    ind_name, ind_steps = independent
    ind = solver.solve(captions, seeds, ind_steps, sampler=ind_name)
    fast_ind = float(latent_mse(fast.latents, ind.latents).mean())
    fastest_key, ind_key = sampler_key(name, fast_steps), sampler_key(ind_name, ind_steps)
    ind_first, ind_last = solver.span(ind_name, ind_steps)

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else float("inf")

    old = None
    if former is not None:
        f = solver.solve(captions, seeds, former[1], sampler=former[0])
        mse = float(latent_mse(f.latents, ind.latents).mean())
        first, last = solver.span(*former)
        old = dict(key=sampler_key(*former), mse=mse, share=ratio(mse, fast_ind), first_timestep=first,
                   last_timestep=last)
    rows = []
    for n in ladder:
        a, b = solver.solve(captions, seeds, n, sampler=sampler), solver.solve(captions, seeds, 2 * n, sampler=sampler)
        moved, dist = float(latent_mse(a.latents, b.latents).mean()), float(latent_mse(fast.latents, b.latents).mean())
        off = float(latent_mse(a.latents, ind.latents).mean())
        first, last = solver.span(sampler, n)
        rows.append(dict(steps=n, doubled=2 * n, moved_mse=moved, fastest_mse=dist, share=ratio(moved, dist),
                         independent_mse=off, fastest_independent_mse=fast_ind,
                         independent_share=ratio(off, fast_ind), n_images=len(captions), first_timestep=first,
                         last_timestep=last, independent=ind_key, independent_first_timestep=ind_first,
                         independent_last_timestep=ind_last))
        if rows[-1]["share"] < share and rows[-1]["independent_share"] < share:
            return Convergence(n, True, fastest_key, rows, ind_key, old, sampler)
    return Convergence(ladder[-1], False, fastest_key, rows, ind_key, old, sampler)


def model_hash(manifest: dict) -> str:
    """One name for a model's files: the sha256 of its manifest's file list (each file's own sha256)."""
    files = manifest.get("files") or {}
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:32]
