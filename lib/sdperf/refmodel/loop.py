"""A resumable training loop: checkpoints written atomically, so a killed stage resumes where it saved.

`parts` hold every state that must survive a kill, and `step_fn(step)` draws its data from the step number alone,
so a resumed run takes an uninterrupted one's steps.
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

import torch

from sdperf.store.results import atomic_write_bytes, atomic_write_text

CURVE_EVERY = 10  # steps averaged into one point of the training curve


class GeneratorState:
    """A torch.Generator as a checkpoint part."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


def save(path: Path, obj) -> None:
    """torch.save to a temporary file renamed into place: a kill leaves the old checkpoint or the new one."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(Path(path), buf.getvalue())


def load(path: Path):
    return torch.load(Path(path), map_location="cpu", weights_only=True)


def save_json(path: Path, obj) -> None:
    atomic_write_text(Path(path), json.dumps(obj, indent=2, sort_keys=True) + "\n")


def cosine_with_warmup(optimizer, warmup: int, total: int):
    """Linear warm-up to the base rate, then a cosine decay to a tenth of it."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def run(path: Path, parts: dict, steps: int, step_fn, every: int = 200, desc: str = "", show: bool = True,
        on_save=None, write: bool = True) -> list[dict]:
    """Take steps [saved step, steps), checkpointing every `every` and at the end (then `on_save(step)`; under
    torchrun only the rank with `write` writes), and return the curve [{step, loss}] (mean per CURVE_EVERY)."""
    from tqdm.auto import tqdm

    path = Path(path)
    start, curve = 0, []
    if path.is_file():
        state = load(path)
        for name, part in parts.items():
            part.load_state_dict(state["parts"][name])
        start, curve = int(state["step"]), list(state["curve"])
    window: list[float] = []
    with tqdm(total=steps, initial=start, desc=desc, disable=not show, unit="step", dynamic_ncols=True) as bar:
        for step in range(start, steps):
            window.append(float(step_fn(step)))
            done = step + 1
            if done % CURVE_EVERY == 0 or done == steps:
                curve.append({"step": done, "loss": sum(window) / len(window)})
                bar.set_postfix(loss=f"{curve[-1]['loss']:.4f}")
                window = []
            bar.update(1)
            if done % every == 0 or done == steps:
                states = {name: part.state_dict() for name, part in parts.items()}
                if write:
                    save(path, {"step": done, "curve": curve, "parts": states})
                if on_save is not None:
                    on_save(done)
    return curve


def finished(path: Path, steps: int) -> bool:
    """Whether the checkpoint at `path` has taken all `steps`."""
    return Path(path).is_file() and int(load(path)["step"]) >= steps
