"""What a verdict on the reference model may say about SD 1.5, technique by technique, beside the published SD 1.5 costs.

Quality is measured on the study's small trained model (sdperf.reference), speed on the real SD architectures at
random init: a reader must be told which quality findings carry over to SD 1.5 and which may not. The reasons are
properties of each kind of technique, stated once here (not inferred from numbers); the published costs come from
sdperf/data/published_technique_quality.csv with their sources.
"""
from __future__ import annotations

import pandas as pd

# a key's prefix (scheduler:..., int8:...) -> (does the reference model's verdict transfer to SD 1.5?, why); by
# prefix, not catalog family: int8 shares the "unet executor" family with lossless executors that do transfer
PREFIXES = {
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
    "deepcache": ("may not transfer",
                "DeepCache reuses deep features between steps; how much they change per step depends on the UNet's "
                "depth and the step count (the paper: SD 1.5 at 50 PLMS steps, 2.3x for a 0.05 CLIP-score drop)"),
    "tome": ("may not transfer",
                "token merging removes redundant tokens; the reference model has 64 tokens at its highest "
                "resolution, SD 1.5 at 512 px has 4096 (tomesd: FID -0.32 at ratio 0.3, -0.10 at 0.5)"),
    "engine": ("transfers", "an engine that keeps fp32 arithmetic changes rounding order only, on any model"),
    "compile": ("transfers", "a compiled graph that keeps fp32 arithmetic changes rounding order only, on any model"),
    "stages": ("may not transfer",
               "an engine for the text encoder and VAE decoder: with int8 weights its error depends on those networks' "
               "ranges"),
    "attention": ("transfers", "sliced attention computes the same softmax in pieces, on any model"),
}


def table(quality: pd.DataFrame) -> pd.DataFrame:
    """One row per judged technique (sdperf.reference.techniques.overall's table): its verdict here, whether that
    transfers to SD 1.5 and why, and the published SD 1.5 cost where one exists."""
    from sdperf.reference import controls, techniques

    from sdperf.reference.technique_report import published

    pub = published().set_index("key")
    rows = []
    for r in quality.to_dict("records"):
        key = r["key"]
        if controls.is_control(key) or str(key).startswith(techniques.REFERENCE) or r.get("status") != "ok":
            continue
        transfers, why = PREFIXES.get(str(key).split(":", 1)[0], ("unknown", "no statement for this technique"))
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
    ref = sorted(set(t.key[t.key.astype(str).str.startswith(techniques.REFERENCE)]))
    # fp32 PLMS-50's own verdict against it is 12's finding (sdperf.report.findings.quality_verdict), not repeated here
    return ("Quality is measured on the study's trained reference model (a 4M-parameter SD-family model on 32 px "
            "images), judged against its converged fp32 solve" + (f" ({', '.join(ref)})" if ref else "")
            + ", never against a poor sampler. To SD 1.5: a sampler's verdict transfers in kind but not in size "
            "(compare latent MSE: SD 1.4 has 0.46 at 10 DPM-Solver++ steps, DPM-Solver-v3); int8, half precision, "
            "caching and merging verdicts may not transfer (the published SD 1.5 costs sit beside each technique in "
            "12's tables).")
