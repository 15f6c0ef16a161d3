"""What a verdict on the reference model may say about SD 1.5, technique by technique, beside the published costs.

Quality is measured on the small trained model, speed on the real SD architectures, so a reader must be told which
findings carry over: each catalog record says why (Technique.transfer); the costs are sdperf.config.published's.
"""
from __future__ import annotations

import pandas as pd

from sdperf.core.errors import ConfigError
from sdperf.optimizations.catalog import Stack

UNKNOWN = ("unknown", "no statement for this technique")


def statement(key: str) -> tuple[str, str]:
    """(does the verdict on `key` transfer to SD 1.5?, why); a stack's is its first output-changing part's."""
    try:
        techs = Stack.of(str(key)).techniques
    except ConfigError:
        return UNKNOWN
    said = [t.transfer for t in techs if t.transfer is not None]
    lossy = [t.transfer for t in techs if t.changes_output and t.transfer is not None]
    return (lossy or said or [UNKNOWN])[0]


def table(quality: pd.DataFrame) -> pd.DataFrame:
    """Per judged technique of `quality`: its verdict, whether it transfers and why, the published SD 1.5 cost."""
    from sdperf.config import published
    from sdperf.judge import controls, techniques

    pub = published.technique_quality()
    rows = []
    for r in quality.to_dict("records"):
        key = r["key"]
        if controls.is_control(key) or str(key).startswith(techniques.REFERENCE) or r.get("status") != "ok":
            continue
        transfers, why = statement(key)
        p = pub.loc[key] if key in pub.index else None
        rows.append(dict(key=key, verdict_here=r.get("quality_verdict"), adherence_delta=r.get("adherence_delta"),
                         latent_mse=r.get("latent_mse"), transfers=transfers, why=why,
                         published_sd15=None if p is None else
                         f"{p.published_cost} ({'; '.join(filter(None, (p.source, p.hardware)))})"))
    return pd.DataFrame(rows)


def sentence(rows: pd.DataFrame) -> str | None:
    """The first screen's statement of what quality was judged against and what transfers; None without rows."""
    from sdperf.judge import techniques

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
