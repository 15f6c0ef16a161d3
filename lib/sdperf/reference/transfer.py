"""What a verdict on the reference model may say about SD 1.5, family by family, beside the published SD 1.5 costs.

Quality is measured on the study's small trained model (sdperf.reference), speed on the real SD architectures at
random init: a reader must be told which quality findings carry over to SD 1.5 and which may not. The reasons are
properties of each family, stated once here (not inferred from numbers); the published costs come from
sdperf/data/published_technique_quality.csv with their sources.
"""
from __future__ import annotations

import pandas as pd

# family -> (does the reference model's verdict transfer to SD 1.5?, why)
FAMILIES = {
    "scheduler": ("in kind, not in size",
                  "a sampler's error is a property of the ODE solver and the guidance, which both models share; its "
                  "size depends on the model's score function: SD 1.4 at guidance 7.5 has latent MSE 0.46 at 10 "
                  "DPM-Solver++ steps (DPM-Solver-v3), so compare the latent MSE columns, not the verdicts"),
    "int8": ("may not transfer",
             "quantization error depends on the ranges of weights and activations; a 4M-parameter UNet on 32 px "
             "images shares neither with SD 1.5's 860M; HF/Intel report plain PTQ does not work for SD 1.5's UNet"),
    "precision": ("may not transfer",
                  "half-precision error grows with depth and attention width (SD 1.5 runs fp16 routinely on GPUs, "
                  "with a VAE kept in fp32 by diffusers for SDXL); the reference model is far shallower"),
    "caching": ("may not transfer",
                "DeepCache reuses deep features between steps; how much they change per step depends on the UNet's "
                "depth and the step count (the paper: SD 1.5 at 50 PLMS steps, 2.3x for a 0.05 CLIP-score drop)"),
    "merging": ("may not transfer",
                "token merging removes redundant tokens; the reference model has 64 tokens at its highest "
                "resolution, SD 1.5 at 512 px has 4096 (tomesd: FID -0.32 at ratio 0.3, -0.10 at 0.5)"),
    "executor": ("transfers",
                 "an executor that keeps fp32 arithmetic changes rounding order only, on any model"),
    "stages": ("may not transfer",
               "int8 weights of the text encoder and VAE decoder: their error depends on those networks' ranges"),
    "attention": ("transfers", "sliced attention computes the same softmax in pieces, on any model"),
}


def table(quality: pd.DataFrame) -> pd.DataFrame:
    """One row per judged technique (sdperf.reference.techniques.overall's table): its verdict here, whether that
    transfers to SD 1.5 and why, and the published SD 1.5 cost where one exists."""
    from sdperf.optimizations import catalog
    from sdperf.reference import controls, techniques

    from sdperf.reference.technique_report import published

    pub = published().set_index("key")
    rows = []
    for r in quality.to_dict("records"):
        key = r["key"]
        if controls.is_control(key) or str(key).startswith(techniques.REFERENCE) or r.get("status") != "ok":
            continue
        family = catalog.Stack.of(key).techniques[-1].family if key != techniques.SEEDS_SAMPLER else "scheduler"
        transfers, why = FAMILIES.get(family, ("unknown", "no statement for this family"))
        p = pub.loc[key] if key in pub.index else None
        rows.append(dict(key=key, verdict_here=r.get("quality_verdict"), adherence_delta=r.get("adherence_delta"),
                         latent_mse=r.get("latent_mse"), transfers=transfers, why=why,
                         published_sd15=None if p is None else f"{p.published_cost} ({p.source}; {p.model_hardware})"))
    return pd.DataFrame(rows)


def sentence(rows: pd.DataFrame) -> str | None:
    """The first screen's statement of what quality was judged against and what of it transfers to SD 1.5, from
    results rows (None before any row of the converged-solve scheme exists)."""
    from sdperf.reference import techniques

    t = techniques.from_rows(rows)
    if t.empty or "quality_verdict" not in t:
        return None
    ref = t[t.key.astype(str).str.startswith(techniques.REFERENCE)]
    per_key = techniques.overall(t[t.status == "ok"], tuple(dict.fromkeys(t.guidance)))
    seeds = per_key[per_key.key == techniques.SEEDS_SAMPLER]
    out = ("Quality is measured on the study's trained reference model (a 4M-parameter SD-family model on 32 px "
           "images), judged against its converged fp32 solve"
           + (f" ({', '.join(sorted(set(ref.key)))})" if len(ref) else "") + ", never against a poor sampler.")
    if len(seeds):
        r = seeds.iloc[0]
        out += (f" fp32 PLMS at the seeds' 50 steps reads {r.quality_verdict} against it (adherence "
                f"{r.adherence_delta:+.3f} [{r.adherence_delta_lo:+.3f}, {r.adherence_delta_hi:+.3f}], n="
                f"{int(r.n_images)}).")
    out += (" To SD 1.5: a sampler's verdict transfers in kind but not in size (compare latent MSE: SD 1.4 has 0.46 "
            "at 10 DPM-Solver++ steps, DPM-Solver-v3); int8, half precision, caching and merging verdicts may not "
            "transfer (the published SD 1.5 costs sit beside each technique in 12's tables).")
    return out
