"""The worker results of one study run, shared by every comparison in it: a baseline, its twin and each
configuration are measured once per run and machine, and every notebook that compares them reads them here.

Why. A comparison needs the fp32 baseline around every round and an fp32 twin for its noise floor: measured
afresh by each of the ten comparisons of a study, those seven SD 1.5 processes (~7 minutes on 2 cores) cost
more than the techniques themselves, and the ladder re-measured every stand-alone technique the notebooks before
it had just measured. Shared, the twin runs once per batch size, a comparison opens on the baseline that closed
the one before it, and a configuration already measured (the ladder's first rungs) is read back. The method is
unchanged: every ratio still divides a configuration's time by the baseline interpolated to the moment it was
timed, among all of the run's baselines.

One ledger per (key, profile, rounds, worker overrides), under the profile's scratch folder. `sdperf run` sets the
key from the commit, the machine's fingerprint and the profile file (KEY_ENV): a killed run's rounds are found again
by the next run of the same code on the same machine, which measures only the rounds still missing, and a run of
another commit or machine starts clean. A notebook opened alone keys by its own run id, so it measures everything
it compares. Records are appended one JSON line at a time under a file lock (two notebooks writing at once lose
nothing; a line cut short by a killed process is skipped on reading), outputs are written atomically.

Resuming. Each record carries its sitting (the run id of the process group that measured it), and after the
baseline that closes a round, the round is marked complete (ROUND_ROLE). A round is whole or absent: of an earlier
sitting, only what it wrote up to its last completed round counts, so a round cut by a kill is measured again in
full, opening on a baseline of the new sitting, and each ratio still divides by baselines of its own sitting.
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

BASELINE_ROLE, TWIN_ROLE, CONFIG_ROLE, ROUND_ROLE = "baseline", "twin", "config", "round"
RECORDS, LOCK = "records.jsonl", ".lock"
# Set by `sdperf run` for its notebooks' kernels (resume_key): the ledger a killed run of the same code, machine and
# profile left is this run's too
KEY_ENV = "SDPERF_LEDGER_KEY"


def resume_key(commit: str, machine: str, profile_sha256: str, tree_sha256: str = "") -> str:
    """The key under which a run's rounds may be resumed: same commit (and, on a dirty tree, the same diff), same
    machine fingerprint, same profile file."""
    detail = "|".join((commit, machine, profile_sha256, tree_sha256))
    return f"resumable-{hashlib.sha256(detail.encode()).hexdigest()[:16]}"


def run_key() -> str:
    """This process's ledger key: what `sdperf run` set, else the run id (a notebook opened alone)."""
    from sdperf.core import environment

    return os.environ.get(KEY_ENV) or environment.run_id()


def forget(folder: Path, keep: str | None) -> list[str]:
    """Remove the resumable ledgers under `folder` (a profile's scratch rounds/) but those of key `keep` (None:
    all): rounds of another commit or machine can never be resumed by this run. Returns the names removed."""
    import shutil

    gone = []
    for sub in sorted(Path(folder).glob("resumable-*")):
        if sub.is_dir() and (keep is None or not sub.name.startswith(f"{keep}-")):
            shutil.rmtree(sub, ignore_errors=True)
            gone.append(sub.name)
    return gone


def name(run_id: str, profile: str, rounds: int, overrides: dict | None) -> str:
    """The ledger's folder name: results taken with other rounds or worker settings are never mixed."""
    detail = json.dumps({"rounds": rounds, **(overrides or {})}, sort_keys=True)
    return f"{run_id}-{profile}-{hashlib.sha256(detail.encode()).hexdigest()[:8]}"


def counted(lines: list[dict], sitting: str | None) -> list[dict]:
    """The records that count for `sitting`: all of its own, and of each earlier sitting what it wrote up to its
    last completed round (a round is whole or absent). Round markers are left out."""
    last_mark = {}
    for i, rec in enumerate(lines):
        if rec.get("role") == ROUND_ROLE:
            last_mark[rec.get("sitting")] = i
    return [rec for i, rec in enumerate(lines) if rec.get("role") != ROUND_ROLE
            and (rec.get("sitting") == sitting or i <= last_mark.get(rec.get("sitting"), -1))]


class Ledger:
    """Append-only worker results of one run (see the module docstring). `sitting`: the run id of this process
    group; None reads every record (as written, marks left out)."""

    def __init__(self, root: Path, sitting: str | None = None):
        self.root = Path(root)
        self.sitting = sitting

    @contextmanager
    def _locked(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def lines(self) -> list[dict]:
        """Every complete line, round marks included, in the order they were written."""
        path = self.root / RECORDS
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a killed writer: not a result
                continue
        return out

    def records(self, batch_size: int | None = None) -> list[dict]:
        """Every record that counts (module docstring: an earlier sitting's unfinished round does not), of one
        batch size if given, in the order they were written."""
        lines = self.lines()
        recs = counted(lines, self.sitting) if self.sitting is not None else \
            [r for r in lines if r.get("role") != ROUND_ROLE]
        return [r for r in recs if batch_size is None or r.get("batch_size") == batch_size]

    def sittings(self, batch_size: int | None = None) -> list[str]:
        """The sittings whose records count, in the order they first wrote."""
        return list(dict.fromkeys(r["sitting"] for r in self.records(batch_size) if r.get("sitting")))

    def close_round(self, round_: int, batch_size: int) -> None:
        """Mark round `round_` complete: its configurations and the baseline after them are all written."""
        self.append({"role": ROUND_ROLE, "round": round_, "batch_size": batch_size})

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
        if self.sitting is not None:
            record = {**record, "sitting": self.sitting}
        line = json.dumps(record, default=float) + "\n"
        with self._locked():
            with open(self.root / RECORDS, "a") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
