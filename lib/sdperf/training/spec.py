"""What one training configuration needs, as the launcher writes it (JSON) for every rank to read: its own module, so
that sdperf.training.launch and sdperf.training.train both import it without importing each other.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from sdperf.training.training_settings import TrainingSettings


@dataclass
class RunSpec:
    profile: str
    arch: str
    weights: str | None
    seed: int
    device: str
    settings: TrainingSettings
    engine: str
    per_rank_batch: int
    threads_per_rank: int
    backend: str
    out_dir: str
    data_path: str | None = None
    deepspeed_config: str | None = None
    label: str = ""

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["settings"] = self.settings.to_dict()
        return json.dumps(d, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        d = json.loads(text)
        d["settings"] = TrainingSettings.from_dict(d["settings"])
        return cls(**d)
