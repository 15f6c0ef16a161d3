"""What a notebook opens first: the validated profile, the environment record, its results recorder."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sdperf.core import environment
from sdperf.measure import memory
from sdperf.optimizations import catalog
from sdperf.store import figure_captions, plots
from sdperf.model.generation import Workload
from sdperf.core.paths import scratch_dir
from sdperf.model.pipelines import build_pipeline
from sdperf.config.profiles import Profile, load_profile
from sdperf.store.results import Recorder

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Study:
    notebook: str
    profile: Profile
    env: dict
    recorder: Recorder = field(repr=False)

    @property
    def device(self) -> str:
        return self.profile.device

    def pipeline(self, dtype: str = "float32"):
        """A freshly built pipeline in `dtype` (the workers' weights cache); NotEnoughMemory when it cannot fit."""
        memory.require(self.profile, f"building the {self.profile.arch} pipeline in this kernel ({self.notebook})")
        weights = scratch_dir(self.profile.name) / "weights"
        return build_pipeline(self.profile, dtype=DTYPES[dtype], weights_cache=weights)

    def workload(self, batch_size: int = 1, steps: int | None = None) -> Workload:
        return Workload.from_profile(self.profile, batch_size=batch_size, steps=steps)

    def save_figure(self, fig, name: str, *, what: str | None = None, baseline: str | None = None,
                    method: str | None = None, n: str | None = None, taken_in: dict | None = None):
        """Save `fig` with its caption (what, baseline, method, n; the device is this study's or `taken_in`'s, the
        machine that took the numbers). A missing or empty field raises ValueError before anything is written."""
        device = figure_captions.device_text(self.env if taken_in is None else taken_in)
        caption = figure_captions.Caption(what=what, device=device, baseline=baseline, method=method, n=n)
        return plots.save_figure(fig, self.profile.name, self.notebook, name, caption)

    def conditions(self, batch_size: int = 1, scope: str = "whole generation") -> str:
        """What a measured figure stands for, for published-vs-measured tables."""
        p, env = self.profile, self.env
        return (f"{scope}; {p.arch}, {p.resolution}px, {p.steps} {p.scheduler} steps, batch {batch_size}, "
                f"{env['device_name']} ({self.device}, {env['threads']} threads)")

    def describe(self) -> str:
        p = self.profile
        weights = p.weights or "random init (timing does not depend on weight values; quality figures do)"
        return (f"profile {p.name}: {p.arch} at {p.resolution}x{p.resolution}, {p.steps} {p.scheduler} steps, "
                f"guidance {p.guidance_scale}, batch sizes {list(p.batch_sizes)}, {p.device}, "
                f"warm-up {p.warmup} + {p.repeats} timed repeats, seed {p.seed}\nweights: {weights}")


def open_study(profile: str | None, notebook: str) -> Study:
    """Validate the profile (fails before any model is built), record the environment, set the plot style."""
    prof = load_profile(profile)
    env = {**environment.record(prof.name, prof.device, catalog.packages()), "setting": prof.setting}
    plots.use_style()
    return Study(notebook=notebook, profile=prof, env=env, recorder=Recorder(notebook, prof.name, env))
