"""What each catalog technique costs in quality, measured on the trained reference model, paired image by image.

Random weights cannot say what int8, fewer steps, DeepCache or token merging do to a picture; the reference model
can. Each technique's stack (sdperf.optimizations.catalog) is applied to a fresh fp32 copy of the verified model,
which then makes the same captions from the same initial latents as the untouched fp32 model (PLMS, the profile's
reference steps, guidance 7.5: the model's quality bar). Against those fp32 images, per prompt:
- adherence delta: mean of (technique - fp32) per image, BCa bootstrap interval (quality.paired_delta);
- domain FID delta: FID(technique) - FID(fp32) against the same held-out renders, the two sets resampled with the
  SAME image indices (a paired percentile bootstrap, recentred on the estimate: quality.recentred), so the interval
  reflects the change and not each set's noise;
- PSNR of each image against its fp32 twin (median and 10th percentile).
Paired, because unpaired means hide regressions (a black frame can out-score a poor image on an average).

The budget (the ladder's "changes the picture" rule, sdperf.experiments.ladder, and the stack search's): adherence
within 1 point of fp32 PLMS-50, domain FID within its bootstrap interval plus a stated margin (issue 15's words).
- Adherence resolves to about +-1-2 points at the study's image counts, so it must be shown inside: the whole
  interval above -ADHERENCE_BUDGET is "within", wholly below is "over", straddling is "undecided".
- Domain FID on 64 evaluator features at 256 paired images has an interval of about +-10 around a margin of ~3
  (FID_BUDGET_REL x the fp32 images' FID of ~33): asking the whole interval to sit under the margin would admit
  only what lowers FID, however harmless. So FID breaks the budget when the change is beyond its own bootstrap
  interval plus the margin (the interval's lower end above +margin: worse than noise can explain), and otherwise
  leaves the verdict to adherence. The rows keep both intervals, so a stricter reader can apply their own rule.
"Undecided" is treated as not kept by the ladder and as not admissible by the search.

Rows go to results.csv under the calling notebook with the technique's key, so 10 (which needs the deltas of its
lossy candidates) and 12 (which shows them all) share one measurement per run: `for_study` measures only the keys
no row of this machine and commit holds yet.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from sdperf.reference import domain, evaluator, quality

GUIDANCE = 7.5  # the reference model's quality bar is stated at 7.5 with 50 PLMS steps
RENDER_BATCH = 16  # prompts per UNet call (UNet batch 32 with guidance: the exported engines' dynamic maximum)
CALIBRATION_CAPTIONS = 8  # captions a calibrated int8 technique generates from (Context.prompts; see quantization)
CALIBRATION_SEED = 7  # its captions come from another seed than the judged ones: calibrating on the test set flatters
ADHERENCE_BUDGET = 0.01  # at most 1 point of adherence lost
FID_BUDGET_REL = 0.10  # at most +10% of the fp32 images' domain FID
N_FID_RESAMPLES = 300
WITHIN, OVER, UNDECIDED = "within budget", "over budget", "undecided"
BASELINE = "fp32-eager"
METHOD = (f"reference model, paired vs its own fp32 images (same captions, same initial latents); adherence: BCa "
          f"bootstrap of per-image deltas; FID: paired percentile bootstrap ({N_FID_RESAMPLES} resamples), recentred on "
          f"the estimate")
METRICS = ("reference_adherence", "reference_adherence_delta", "reference_domain_fid", "reference_domain_fid_delta",
           "reference_image_psnr_db")
# the techniques 12 judges by default: every family of the catalog that can change a picture, and the lossless
# executors whose "lossless" the paired deltas check
DEFAULT_KEYS = (
    "precision:float16", "precision:bfloat16", "compile:default", "engine:onnxruntime-fp32", "engine:openvino-f32",
    "int8:openvino-nncf-weights", "int8:openvino-nncf-ptq", "int8:openvino-nncf-hybrid", "int8:torch-ao-dynamic",
    "attention:sliced:max", *(f"scheduler:{s}@{n}" for s in ("dpmpp-2m", "euler") for n in (10, 15, 20, 25)),
    *(f"scheduler:unipc@{n}" for n in (10, 15, 20)),
    "deepcache:2", "deepcache:3", "deepcache:5", "tome:0.3", "tome:0.5", "stages:openvino-int8w")


def profile_for(base, folder: Path, steps: int):
    """The profile the techniques see (resolution, latent size, static shapes, calibration prompt): the reference
    model's, on the CPU, at the given steps and GUIDANCE, with a domain caption as its prompt."""
    from sdperf.architectures import ARCHS
    from sdperf.reference import model

    side = ARCHS[model.ARCH].vae["sample_size"]  # the image side the reference model was trained at
    return replace(base, name=f"{base.name}-reference", arch=model.ARCH, resolution=side, steps=steps,
                   scheduler="plms", guidance_scale=GUIDANCE, batch_sizes=(RENDER_BATCH,), dtype="float32",
                   device="cpu", weights=str(folder), prompt=quality.prompts(1)[0].caption)


def render(pipe, captions: list[str], seeds: list[int], steps: int, grad_mode: str = "inference_mode",
           batch: int = RENDER_BATCH) -> tuple[np.ndarray, float]:
    """(uint8 NHWC images at GUIDANCE, seconds): quality.generate, timed (every call one shape)."""
    start = time.perf_counter()
    images = quality.generate(pipe, captions, seeds, GUIDANCE, steps, batch=batch, grad_mode=grad_mode)
    return images, time.perf_counter() - start


@dataclass
class Judged:
    """One set of images and what the evaluator makes of it."""

    images: np.ndarray
    adherence: np.ndarray  # per image
    features: torch.Tensor
    seconds: float


def judge(net, images: np.ndarray, truth: np.ndarray, seconds: float) -> Judged:
    return Judged(images, evaluator.adherence_checks(evaluator.predict(net, images), truth),
                  evaluator.features(net, images), seconds)


def fid_delta(variant: torch.Tensor, base: torch.Tensor, real: quality.Real, seed: int = 0,
              n_resamples: int = N_FID_RESAMPLES) -> tuple[float, float, float]:
    """(FID(variant) - FID(base), low, high): both image sets resampled with the same indices each time."""
    fid_of = quality.fid_to(real)
    rng = np.random.default_rng(seed)
    deltas = []
    for _ in range(n_resamples):
        idx = torch.as_tensor(rng.integers(len(base), size=len(base)))
        deltas.append(fid_of(variant[idx]) - fid_of(base[idx]))
    d = fid_of(variant) - fid_of(base)
    return (d, *quality.recentred(d, deltas))


def psnr_per_image(images: np.ndarray, base: np.ndarray) -> np.ndarray:
    """PSNR in dB of each 8-bit image against its fp32 twin (inf where identical)."""
    a, b = images.astype(np.float64) / 255, base.astype(np.float64) / 255
    mse = ((a - b) ** 2).reshape(len(a), -1).mean(axis=1)
    with np.errstate(divide="ignore"):
        return np.where(mse == 0, np.inf, 10 * np.log10(1.0 / mse))


def verdict(adherence_lo: float, adherence_hi: float, fid_lo: float, fid_hi: float, base_fid: float) -> str:
    """OVER when the adherence interval lies wholly below -1 point or the FID change exceeds its own interval plus
    the margin (lower end above it); else WITHIN when the adherence interval lies wholly above -1 point, else
    UNDECIDED. `fid_hi` is the interval's other end, kept in the signature (and the rows) for a stricter reader."""
    fid_margin = FID_BUDGET_REL * base_fid
    if adherence_hi < -ADHERENCE_BUDGET or fid_lo > fid_margin:
        return OVER
    if adherence_lo >= -ADHERENCE_BUDGET:
        return WITHIN
    return UNDECIDED


def budget_text(base_fid: float | None = None) -> str:
    fid = (f"{FID_BUDGET_REL:.0%} of the fp32 images' domain FID" +
           (f" (+{FID_BUDGET_REL * base_fid:.2f})" if base_fid is not None else ""))
    return (f"adherence interval above -{ADHERENCE_BUDGET:.2f} (1 point) and the domain-FID change within its interval "
            f"plus {fid} (interval's lower end at most that), 95% paired bootstrap intervals")


def measure(keys: list[str], base_profile, *, n: int, steps: int, folder: Path | None = None,
            scratch: Path | None = None, say: Callable[[str], None] = print) -> pd.DataFrame:
    """One row per technique (the first: fp32 itself) with its paired deltas against the fp32 images."""
    from sdperf.comparison import release
    from sdperf.optimizations.catalog import Context, Stack
    from sdperf.pipelines import build_from_weights
    from sdperf.reference import store

    stacks = {k: Stack.of(k) for k in keys}  # an unknown key fails here, before any model is loaded
    folder = Path(folder or store.default_dir())
    pipe, net, manifest = store.load(folder)  # verified once; each technique then loads the same files
    profile = profile_for(base_profile, folder, steps)
    real = quality.Real.of(net, manifest["recipe"]["evaluator_held_out"])
    items = quality.prompts(n)
    captions, truth, seeds = [s.caption for s in items], domain.labels_many(items), list(range(n))
    images, seconds = render(pipe, captions, seeds, steps)
    base = judge(net, images, truth, seconds)
    del pipe
    base_fid = quality.domain_fid(base.features, real)
    mean, lo, hi = quality.mean_interval(base.adherence)
    rows = [dict(key=BASELINE, label="fp32 eager (the reference)", family="", status="ok", n_images=n,
                 steps=steps, adherence=mean, adherence_lo=lo, adherence_hi=hi, adherence_delta=0.0,
                 adherence_delta_lo=0.0, adherence_delta_hi=0.0, domain_fid=base_fid, fid_delta=0.0,
                 fid_delta_lo=0.0, fid_delta_hi=0.0, psnr_db_median=math.inf, psnr_db_p10=math.inf,
                 quality_verdict=WITHIN, seconds=seconds, note="")]
    for key, stack in stacks.items():
        ctx = Context(profile, batch_size=RENDER_BATCH, scratch=scratch, artefacts=scratch,
                      prompts=tuple(s.caption for s in domain.scenes(CALIBRATION_SEED, CALIBRATION_CAPTIONS)))
        row = dict(key=key, label=stack.label, family=", ".join(t.family for t in stack.techniques), n_images=n,
                   steps=stack.steps or steps)
        ok, reason = stack.availability(ctx)
        if not ok:
            say(f"{key}: not applicable: {reason}")
            rows.append(dict(row, status="not_applicable", note=f"not applicable: {reason}"))
            continue
        try:
            pipe = stack.apply(build_from_weights(str(folder), "plms"), ctx)
            images, seconds = render(pipe, captions, seeds, stack.steps or steps, stack.grad_mode)
            judged = judge(net, images, truth, seconds)
        except Exception as exc:  # recorded with its error; the other techniques still run
            msg = f"{type(exc).__name__}: {exc}"
            say(f"{key}: failed: {msg[:300]}")
            rows.append(dict(row, status="failed", note=msg[:500]))
            continue
        finally:
            pipe = None
            release()
        rows.append(dict(row, status="ok", **_deltas(judged, base, real, base_fid), note=_facts(ctx.facts)))
        r = rows[-1]
        say(f"{key}: adherence {r['adherence_delta']:+.4f} [{r['adherence_delta_lo']:+.4f}, "
            f"{r['adherence_delta_hi']:+.4f}], FID {r['fid_delta']:+.2f} [{r['fid_delta_lo']:+.2f}, "
            f"{r['fid_delta_hi']:+.2f}], PSNR median {r['psnr_db_median']:.1f} dB: {r['quality_verdict']}")
    table = pd.DataFrame(rows)
    table.attrs.update(manifest_commit=manifest["commit"], base_fid=base_fid)
    return table


def _deltas(judged: Judged, base: Judged, real: quality.Real, base_fid: float) -> dict:
    mean, lo, hi = quality.mean_interval(judged.adherence)
    d, d_lo, d_hi = quality.paired_delta(judged.adherence, base.adherence)
    f, f_lo, f_hi = fid_delta(judged.features, base.features, real)
    psnr = psnr_per_image(judged.images, base.images)
    return dict(adherence=mean, adherence_lo=lo, adherence_hi=hi, adherence_delta=d, adherence_delta_lo=d_lo,
                adherence_delta_hi=d_hi, domain_fid=base_fid + f, fid_delta=f, fid_delta_lo=f_lo, fid_delta_hi=f_hi,
                psnr_db_median=float(np.percentile(psnr, 50, method="lower")),  # "lower": no inf - inf between
                psnr_db_p10=float(np.percentile(psnr, 10, method="lower")),      # identical images
                quality_verdict=verdict(d_lo, d_hi, f_lo, f_hi, base_fid), seconds=judged.seconds)


def _facts(facts: dict) -> str:
    return "; ".join(f"{k}={v}" for k, v in facts.items() if k not in ("setup_peak_mib",))[:300]


SCENARIO = "technique quality on the reference model"


def _scenario(key: str, steps: int) -> str:
    return f"{SCENARIO}: {key}, guidance {GUIDANCE:g}, {steps} steps"


def record(study, table: pd.DataFrame) -> None:
    """The table as results rows under the calling notebook, each with its technique's key."""
    base_fid = float(table.loc[table.key == BASELINE, "domain_fid"].iloc[0])
    rows = []
    for r in table.to_dict("records"):
        scenario, n, key = _scenario(r["key"], int(r["steps"])), int(r["n_images"]), r["key"]
        common = dict(scenario=scenario, n=n, key=key, method=METHOD)
        if r["status"] != "ok":
            rows.append(dict(common, metric="reference_adherence_delta", value=None, unit="", status=r["status"],
                             note=str(r["note"])[:500]))
            continue
        note = f"{r['quality_verdict']} ({budget_text(base_fid)}); {r['note']}".strip("; ")
        rows += [dict(common, metric="reference_adherence", value=r["adherence"], unit="share",
                      lo=r["adherence_lo"], hi=r["adherence_hi"], note=r["label"]),
                 dict(common, metric="reference_adherence_delta", value=r["adherence_delta"], unit="share",
                      lo=r["adherence_delta_lo"], hi=r["adherence_delta_hi"], note=note),
                 dict(common, metric="reference_domain_fid", value=r["domain_fid"], unit="", note=r["label"]),
                 dict(common, metric="reference_domain_fid_delta", value=r["fid_delta"], unit="",
                      lo=r["fid_delta_lo"], hi=r["fid_delta_hi"], note=note),
                 dict(common, metric="reference_image_psnr_db", value=_finite(r["psnr_db_median"]), unit="dB",
                      p10=_finite(r["psnr_db_p10"]), note="median over images vs the fp32 twin (p10: 10th "
                      "percentile); " + ("identical to fp32" if math.isinf(r["psnr_db_median"]) else "8-bit PNGs"))]
    study.recorder.add_many(rows)


def _finite(x: float) -> float | None:
    """results.csv holds no inf: an identical image's PSNR is stored empty, its note says identical."""
    return None if math.isinf(x) else float(x)


def from_rows(rows: pd.DataFrame, keys: list[str], n: int, steps: int) -> pd.DataFrame:
    """The table `measure` returned, rebuilt from results rows of these keys at these settings (rows of
    techniques not yet measured are absent)."""
    from sdperf.optimizations.catalog import Stack

    if rows.empty:
        return pd.DataFrame()
    expected = {_scenario(k, (Stack.of(k).steps if k != BASELINE else None) or steps) for k in [BASELINE, *keys]}
    t = rows[rows.scenario.isin(expected) & rows.metric.isin(METRICS)]
    t = t[pd.to_numeric(t.n, errors="coerce") == n]
    out = []
    for key, g in t.groupby("key", sort=False):
        by = {m: r for m, r in zip(g.metric, g.itertuples())}
        delta = by.get("reference_adherence_delta")
        if delta is None:
            continue
        row = dict(key=key, n_images=n, status=delta.status, note=delta.note)
        if delta.status == "ok":
            a, f, fd, p = (by[m] for m in ("reference_adherence", "reference_domain_fid",
                                           "reference_domain_fid_delta", "reference_image_psnr_db"))
            row.update(label=a.note, adherence=a.value, adherence_lo=a.lo, adherence_hi=a.hi,
                       adherence_delta=delta.value, adherence_delta_lo=delta.lo, adherence_delta_hi=delta.hi,
                       domain_fid=f.value, fid_delta=fd.value, fid_delta_lo=fd.lo, fid_delta_hi=fd.hi,
                       psnr_db_median=math.inf if pd.isna(p.value) else p.value,
                       psnr_db_p10=math.inf if pd.isna(p.p10) else p.p10)
        out.append(row)
    table = pd.DataFrame(out)
    if table.empty or BASELINE not in set(table.key):
        return pd.DataFrame()
    base_fid = float(table.loc[table.key == BASELINE, "domain_fid"].iloc[0])
    ok = table.status == "ok"
    table.loc[ok, "quality_verdict"] = [verdict(r.adherence_delta_lo, r.adherence_delta_hi, r.fid_delta_lo,
                                                r.fid_delta_hi, base_fid) if r.key != BASELINE else WITHIN
                                        for r in table[ok].itertuples()]
    order = {k: i for i, k in enumerate([BASELINE, *keys])}
    return table.sort_values("key", key=lambda s: s.map(order)).reset_index(drop=True)


def for_study(study, keys: list[str], *, n: int, steps: int, folder: Path | None = None,
              say: Callable[[str], None] = print) -> pd.DataFrame:
    """The quality table of `keys` for this run: rows of this machine and commit are read back, the keys they lack
    are measured (with a fresh fp32 reference) and recorded under the calling notebook."""
    from sdperf.optimizations.catalog import Stack
    from sdperf.paths import scratch_dir
    from sdperf.reference import store

    for k in keys:  # unknown keys fail before anything is read or loaded
        Stack.of(k)
    have = from_rows(study.recorder.current(), keys, n, steps)
    missing = [k for k in keys if have.empty or k not in set(have.key)]
    if missing:
        say(f"measuring {len(missing)} technique(s) on the reference model: {', '.join(missing)}")
        scratch = scratch_dir(study.profile.name) / "reference-techniques"
        record(study, measure(missing, study.profile, n=n, steps=steps, folder=folder or store.default_dir(),
                              scratch=scratch, say=say))
        have = from_rows(study.recorder.current(), keys, n, steps)
    return have
