"""The worker results of one study run, shared by every comparison in it: a baseline, its twin and each
configuration are measured once per run and machine, and every notebook that compares them reads them here.

Why. A comparison needs the fp32 baseline around every round and an fp32 twin for its noise floor: measured
afresh by each of the ten comparisons of a study, those seven SD 1.5 processes (~7 minutes on 2 cores) cost
more than the techniques themselves, and the ladder re-measured every stand-alone technique the notebooks before
it had just measured. Shared, the twin runs once per batch size, a comparison opens on the baseline that closed
the one before it, and a configuration already measured (the ladder's first rungs) is read back. The method is
unchanged: every ratio still divides a configuration's time by the baseline interpolated to the moment it was
timed, among all of the run's baselines.

One ledger per (run id, profile, rounds, worker overrides), under the profile's scratch folder: a notebook opened
alone gets a run id of its own, so it measures everything it compares; `sdperf run` gives all notebooks one.
Records are appended one JSON line at a time under a file lock (two notebooks writing at once lose nothing; a
line cut short by a killed process is skipped on reading), outputs are written atomically.
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

BASELINE_ROLE, TWIN_ROLE, CONFIG_ROLE = "baseline", "twin", "config"
RECORDS, LOCK = "records.jsonl", ".lock"


def name(run_id: str, profile: str, rounds: int, overrides: dict | None) -> str:
    """The ledger's folder name: results taken with other rounds or worker settings are never mixed."""
    detail = json.dumps({"rounds": rounds, **(overrides or {})}, sort_keys=True)
    return f"{run_id}-{profile}-{hashlib.sha256(detail.encode()).hexdigest()[:8]}"


class Ledger:
    """Append-only worker results of one run (see the module docstring)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @contextmanager
    def _locked(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def records(self, batch_size: int | None = None) -> list[dict]:
        """Every complete record (of one batch size, if given), in the order they were written."""
        path = self.root / RECORDS
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed writer: not a result
                continue
            if batch_size is None or rec.get("batch_size") == batch_size:
                out.append(rec)
        return out

    def _output_path(self, role: str, stack: str, batch_size: int) -> Path:
        safe = hashlib.sha256(f"{role}|{stack}|{batch_size}".encode()).hexdigest()[:16]
        return self.root / "outputs" / f"{safe}.pt"

    def has_output(self, role: str, stack: str, batch_size: int) -> bool:
        return self._output_path(role, stack, batch_size).is_file()

    def output(self, role: str, stack: str, batch_size: int):
        """The saved output (latents, images) of the first round of an entry, or None."""
        path = self._output_path(role, stack, batch_size)
        if not path.is_file():
            return None
        import torch

        return SimpleNamespace(**torch.load(path, weights_only=True))

    def append(self, record: dict, output=None) -> None:
        """One worker's result (with role, stack, batch_size, round) and, the first time, its output."""
        from sdperf.store.results import atomic_write_bytes

        if output is not None and not self.has_output(record["role"], record["stack"], record["batch_size"]):
            import torch

            buf = io.BytesIO()
            torch.save({"latents": output.latents, "images": output.images}, buf)
            atomic_write_bytes(self._output_path(record["role"], record["stack"], record["batch_size"]),
                               buf.getvalue())
        line = json.dumps(record, default=float) + "\n"
        with self._locked():
            with open(self.root / RECORDS, "a") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
