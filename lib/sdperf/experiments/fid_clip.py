"""12_fid_clip: what the notebook calls, and the state its sections hand on to one another: one object, `FidClip`,
opened once, whose methods are the notebook's sections in order, each using what the one before it kept."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from sdperf.config import published
from sdperf.measure.study import Study, open_study
from sdperf.quality import curve, gate, rungs, score
from sdperf.quality.quality_settings import QualitySettings, settings
from sdperf.judge import guidance_curve as reference_curve
from sdperf.judge import technique_report, techniques, transfer

NOTEBOOK = "12_fid_clip"
PUBLISHED_COLUMNS = ["source", "settings", "key", "what", "metric", "value", "unit"]


@dataclass
class FidClip:
    study: Study
    settings: QualitySettings
    kept: dict = field(default_factory=dict, repr=False)  # what a section made for a later one, by name

    def describe(self) -> str:
        return f"{self.settings.headline()}\n{self.study.describe()}"

    def protocol(self) -> pd.DataFrame:
        return curve.protocol(self.study, self.settings)

    def generate(self, rung_keys: list[str], sd_curve: bool = True) -> None:
        """The curve's images at every guidance scale (unless `sd_curve` is off), then each rung's on the same noise."""
        if sd_curve:
            self.kept["curve_folder"] = curve.generate(self.study, self.settings)
        else:
            curve.skip(self.study, self.settings)
        self.kept["rung_sets"] = rungs.generate(self.study, self.settings, rung_keys)

    def load_scorers(self) -> score.Scorers | None:
        """Inception and CLIP, when there are images for them: none without the curve and rungs."""
        if "curve_folder" not in self.kept and not self.kept.get("rung_sets"):
            print("no scorers loaded: neither curve nor rung images to score")
            self.kept["scorers"] = None  # what every later section reads: nothing to score with
        else:
            self.kept["scorers"] = score.Scorers.from_settings(self.settings, seed=self.study.profile.seed)
        return self.kept["scorers"]

    def score_curve(self) -> pd.DataFrame:
        """One FID / CLIP point per guidance scale, against the reference it names."""
        if "curve_folder" not in self.kept:
            print("not measured:", curve.skip_reason(self.study, self.settings))
            return pd.DataFrame(columns=["guidance", "n_images"])
        result = curve.score_curve(self.study, self.settings, self.kept["scorers"], self.kept["curve_folder"])
        self.kept["curve"] = result
        print("reference:", result.reference.what)
        return result.table

    def plot_curve(self, compare_profiles: list[str]):
        if "curve" not in self.kept:
            print("no figure: the curve was not measured in this run")
            return None
        return curve.plot(self.study, self.settings, self.kept["curve"], curve.stored_curves(compare_profiles))

    def sample_grid(self):
        if "curve" not in self.kept:
            print("no sample grid: the curve was not measured in this run")
            return None
        return curve.sample_grid(self.study, self.kept["curve"].folder)

    def score_rungs(self) -> pd.DataFrame:
        """Each rung's images against the fp32 eager images of the same captions and noise."""
        self.kept["frontier"] = rungs.score_rungs(self.study, self.settings, self.kept["scorers"],
                                                  self.kept["rung_sets"])
        return self.kept["frontier"]

    def plot_rungs(self):
        return rungs.plot(self.study, self.settings, self.kept["frontier"])

    def reference_curve(self) -> pd.DataFrame:
        """The same protocol on the study's trained reference model, where a curve means something."""
        table, self.kept["reference_manifest"] = reference_curve.for_study(self.study, self.settings)
        print(reference_curve.verdict(table))
        return table

    def technique_costs(self, keys: list[str]) -> pd.DataFrame:
        """Each technique judged on the reference model, printing the plan, budget, controls and convergence used."""
        plan = techniques.Plan.of(self.settings)
        judged = techniques.for_study(self.study, keys, plan)
        self.kept["technique_quality"] = judged
        print("plan:", plan.text())
        print("budget:", techniques.budget_text())
        trusted, why = judged.attrs["trusted"]
        print("controls:", "as required" if trusted else "FAILED, the budget cannot be trusted: " + "; ".join(why))
        said = techniques.convergence_sentence(self.study.recorder.current())
        print(said or "the reference's convergence: not checked")
        print(judged.attrs["convergence"].round(5).to_string(index=False))
        reuse = techniques.reuse_sentence(self.study.recorder.current())
        if reuse:
            print(reuse)
        return technique_report.table(self.study, judged)

    def plot_techniques(self):
        return technique_report.plot(self.study, self.kept["technique_quality"])

    def transfer(self) -> pd.DataFrame:
        """Per family, whether a verdict on the reference model carries over to SD 1.5, and why."""
        return transfer.table(self.kept["technique_quality"])

    def gate_verdict(self) -> str:
        got = self.kept.get("curve")
        return gate.verdict(self.study, self.settings, None if got is None else got.table)["verdict"]


def open_fid_clip(profile: str | None) -> FidClip:
    """The study and its quality section with every file it names, checked before any model is built."""
    study = open_study(profile, notebook=NOTEBOOK)
    return FidClip(study, settings(study.profile))


def published_quality() -> pd.DataFrame:
    """The published quality figures with their conditions, in a table of their own: a figure from a random network
    or a few images must never sit beside a published FID as if comparable."""
    return published.quality()[PUBLISHED_COLUMNS]
