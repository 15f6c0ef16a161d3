"""The caption every figure of the study carries: what it shows, on which device, against which baseline, by which
method, over what n: a speed-up bar read alone means nothing without the machine and what it divides. It is stored
beside the figure as `<notebook>__<name>.caption.json`, staged and promoted with it; the report renders it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

SUFFIX = ".caption.json"
NO_BASELINE = "none: absolute values"  # the baseline of a figure whose numbers divide nothing
FIELDS = ("what", "device", "baseline", "method", "n")


@dataclass(frozen=True)
class Caption:
    """The five parts; each must be non-empty text (checked before any file is written)."""

    what: str
    device: str
    baseline: str
    method: str
    n: str

    def __post_init__(self):
        missing = [f.name for f in fields(self) if not isinstance(getattr(self, f.name), str)
                   or not getattr(self, f.name).strip()]
        if missing:
            got = {name: getattr(self, name) for name in missing}
            raise ValueError(f"figure caption: {', '.join(missing)} missing or empty (got {got}); every figure "
                             f"needs {', '.join(FIELDS)} as non-empty text (baseline {NO_BASELINE!r} when its "
                             "numbers divide nothing)")

    def text(self) -> str:
        """One paragraph: 'What. Device: ... Baseline: ... Method: ... n: ...'."""
        def clause(s: str) -> str:
            s = " ".join(s.split())
            return s if s.endswith((".", "?", "!")) else s + "."
        return " ".join([clause(self.what), clause(f"Device: {self.device}"), clause(f"Baseline: {self.baseline}"),
                         clause(f"Method: {self.method}"), clause(f"n: {self.n}")])

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "text": self.text()}, indent=1, ensure_ascii=False) + "\n"


def device_text(env: dict) -> str:
    """The device a figure's numbers were taken on, from the environment record (or its "published_hardware")."""
    if env.get("published_hardware"):
        return f"{env['published_hardware']} (published figures; nothing in this figure was measured here)"
    fms = env.get("cpu_family_model_stepping")
    cpu = f"{env.get('cpu_model') or 'unknown CPU'} (family/model/stepping {fms or 'not recorded'})"
    if env.get("device") == "cuda":
        return f"GPU {env.get('device_name') or 'unknown'} (host CPU {cpu})"
    threads = env.get("threads")
    return f"CPU {cpu}, {threads} torch thread{'s' if threads != 1 else ''}" if threads else f"CPU {cpu}"


def sidecar(figure: Path) -> Path:
    figure = Path(figure)
    return figure.with_name(figure.name.rsplit(".", 1)[0] + SUFFIX)


def read(figure: Path) -> Caption | None:
    """The stored caption of `figure`, or None when there is none; an unreadable one raises ValueError naming it."""
    path = sidecar(figure)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Caption(**{k: data.get(k) for k in FIELDS})
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"caption file {str(path)!r} is not a valid caption: {e}") from None
