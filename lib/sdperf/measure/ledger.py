"""The worker results of one study run, shared by every comparison in it: a baseline, its twin and each
configuration are measured once per run and machine, and every notebook that compares them reads them here.

Measured afresh by each comparison, the baselines and twin would cost more than the techniques.

One ledger per (key, profile, rounds, worker overrides) under the profile's scratch folder; `sdperf run` sets the key
(KEY_ENV, resume_key) so that a killed run's successor measures only the missing rounds. Records are JSON lines
appended under a file lock, each with its sitting (the run id that measured it); a round mark (ROUND_ROLE) follows
the baseline that closes a round, and of an earlier sitting only what it wrote up to its last mark counts.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

BASELINE_ROLE, TWIN_ROLE, CONFIG_ROLE, ROUND_ROLE = "baseline", "twin", "config", "round"
RECORDS, LOCK, SITTINGS = "records.jsonl", ".lock", "sittings.txt"  # sittings: the run ids that wrote here
KEY_ENV = "SDPERF_LEDGER_KEY"  # set by `sdperf run` for its notebooks' kernels (resume_key)


# What a key is made of: a resumed run never divides rounds taken under other code, machine or worker settings
RESUME_PARTS = ("commit", "tree", "machine", "profile", "threads", "affinity", "libraries")
META_SUFFIX = ".key.json"  # rounds/<key>.key.json: the parts a key was made from, so a discarded one says why


def resume_parts(commit: str, machine: str, profile_text: str, tree_sha256: str = "") -> dict:
    """Everything a run's rounds depend on: code, machine, the profile's settings, threads, CPU affinity, libraries."""
    import yaml

    from sdperf.core import environment
    from sdperf.optimizations import catalog

    values = yaml.safe_load(profile_text) or {}
    if isinstance(values, dict):
        values = {k: v for k, v in values.items() if k not in ("description", "expected")}
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {"commit": commit, "tree": tree_sha256, "machine": machine,
            "profile": hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16],
            "threads": {k: os.environ.get(k, "unset") for k in environment.THREAD_ENV},
            "affinity": affinity, "libraries": environment.package_versions(environment.PACKAGES + catalog.packages())}


def resume_key(parts: dict) -> str:
    """The key under which a run's rounds may be resumed: every one of `parts` the same."""
    detail = json.dumps({k: parts.get(k) for k in RESUME_PARTS}, sort_keys=True, default=str)
    return f"resumable-{hashlib.sha256(detail.encode()).hexdigest()[:16]}"


def remember(folder: Path, key: str, parts: dict) -> None:
    """Keep what `key` was made from beside its ledgers (written whole or not at all)."""
    from sdperf.store.results import atomic_write_bytes

    Path(folder).mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(Path(folder) / f"{key}{META_SUFFIX}", json.dumps(parts, sort_keys=True, default=str).encode())


def run_key() -> str:
    """This process's ledger key: what `sdperf run` set, else the run id (a notebook opened alone)."""
    from sdperf.core import environment

    return os.environ.get(KEY_ENV) or environment.run_id()


def _differences(old, new: dict | None) -> str:
    """What differs between a discarded key's parts and this run's, in words."""
    if old is None:
        return "a run whose key recorded no parts"
    if not isinstance(old, dict) or new is None:
        return "a run whose key record is unreadable"
    said = []
    for part in RESUME_PARTS:
        a, b = old.get(part), new.get(part)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            moved = [f"{k} {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            said.append(f"other {part} ({', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''})")
        elif part in ("profile", "tree", "commit", "machine"):
            said.append(f"another {part}" if part != "profile" else "other profile settings")
        else:
            said.append(f"other {part} ({str(a)[:40]} -> {str(b)[:40]})")
    return "a run with " + "; ".join(said) if said else "a run with the same parts"


_RESUMABLE = re.compile(r"resumable-[0-9a-f]{16}")


def _read_meta(path: Path):
    if not path.is_file() or path.is_symlink():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return "unreadable"


def forget(folder: Path, keep: str | None, parts: dict | None = None) -> list[str]:
    """Remove the resumable ledgers under `folder` and their key records but `keep`'s (None: all, --force); one line
    per discarded key that held ledgers, with what differed from `parts`. Only names sdperf writes are removed, a
    link as a link, nothing through a link or outside the reports folder."""
    from sdperf.core.paths import removable, remove_owned

    folder = Path(folder)
    if not folder.is_dir() or not removable(folder):
        return []
    keys: dict[str, list[Path]] = {}
    for entry in sorted(folder.iterdir()):
        m = _RESUMABLE.match(entry.name)
        if m and m.group(0) != keep:
            keys.setdefault(m.group(0), []).append(entry)
    said = []
    for key, entries in keys.items():
        meta = folder / f"{key}{META_SUFFIX}"
        why = "--force: every round is measured again" if keep is None else _differences(_read_meta(meta), parts)
        held = [e for e in entries if e != meta]
        for entry in entries:
            remove_owned(entry)
        if held:
            said.append(f"{key}: {len(held)} ledger(s) of {why}")
    return said


def name(run_id: str, profile: str, rounds: int, overrides: dict | None) -> str:
    """The ledger's folder name: results taken with other rounds or worker settings are never mixed."""
    detail = json.dumps({"rounds": rounds, **(overrides or {})}, sort_keys=True)
    return f"{run_id}-{profile}-{hashlib.sha256(detail.encode()).hexdigest()[:8]}"


REQUIRED = ("role", "batch_size", "round")  # every record's; a result's also its stack and status
RESULT_REQUIRED = ("stack", "status")


def _well_formed(rec) -> bool:
    if not isinstance(rec, dict) or any(k not in rec for k in REQUIRED):
        return False
    if rec["role"] == ROUND_ROLE:
        return True
    return rec["role"] in (BASELINE_ROLE, TWIN_ROLE, CONFIG_ROLE) and all(k in rec for k in RESULT_REQUIRED)


def _identity(rec: dict) -> str:
    """What makes a record one measurement: a configuration or twin is one per sitting and round, a baseline not."""
    if rec["role"] in (CONFIG_ROLE, TWIN_ROLE) and rec.get("sitting") is not None:
        return "|".join(str(rec.get(k)) for k in ("sitting", "role", "stack", "batch_size", "round"))
    return json.dumps(rec, sort_keys=True, default=str)


def counted(lines: list[dict], sitting: str | None) -> list[dict]:
    """The records that count for `sitting`: its own, and each earlier sitting's up to its last round mark."""
    last_mark = {}
    for i, rec in enumerate(lines):
        if rec.get("role") == ROUND_ROLE:
            last_mark[rec.get("sitting")] = i
    return [rec for i, rec in enumerate(lines) if rec.get("role") != ROUND_ROLE
            and (rec.get("sitting") == sitting or i <= last_mark.get(rec.get("sitting"), -1))]


class Ledger:
    """Append-only worker results of one run. `sitting`: this process group's run id; None reads every record."""

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
        """Every complete record, round marks included, in written order, each once (_identity). A line cut short is
        skipped; a JSON line that is not a record, or of a sitting that never wrote here, with a warning."""
        path = self.root / RECORDS
        if not path.is_file():
            return []
        out, seen, bad = [], set(), []
        known = self._sittings()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed writer: not a result
                continue
            if not _well_formed(rec) or (rec.get("sitting") is not None and rec["sitting"] not in known):
                bad.append(number)  # not a record, or one of a sitting that never wrote here (copied in)
                continue
            ident = _identity(rec)
            if ident in seen:
                continue
            seen.add(ident)
            out.append(rec)
        if bad:
            import warnings

            warnings.warn(f"{path}: line(s) {', '.join(map(str, bad[:5]))}{' ...' if len(bad) > 5 else ''} are not "
                          "ledger records (each is a JSON object with " + ", ".join(REQUIRED) + ", of a sitting "
                          "that wrote here); skipped", stacklevel=2)
        return out

    def _sittings(self) -> set[str]:
        path = self.root / SITTINGS
        return set(path.read_text(errors="replace").split()) if path.is_file() else set()

    def records(self, batch_size: int | None = None) -> list[dict]:
        """Every record that counts (counted), of one batch size if given, in written order."""
        lines = self.lines()
        recs = counted(lines, self.sitting) if self.sitting is not None else \
            [r for r in lines if r.get("role") != ROUND_ROLE]
        return [r for r in recs if batch_size is None or r.get("batch_size") == batch_size]

    def sittings(self, batch_size: int | None = None) -> list[str]:
        return list(dict.fromkeys(r["sitting"] for r in self.records(batch_size) if r.get("sitting")))

    def close_round(self, round_: int, batch_size: int) -> None:
        """Mark round `round_` complete: its configurations and the baseline after them are all written."""
        self.append({"role": ROUND_ROLE, "round": round_, "batch_size": batch_size})

    def _output_path(self, role: str, stack: str, batch_size: int) -> Path:
        safe = hashlib.sha256(f"{role}|{stack}|{batch_size}".encode()).hexdigest()[:16]
        return self.root / "outputs" / f"{safe}.pt"

    def has_output(self, role: str, stack: str, batch_size: int) -> bool:
        """Whether an intact output of the entry is stored (a damaged one is set aside and saved again)."""
        return self.output(role, stack, batch_size) is not None

    def output(self, role: str, stack: str, batch_size: int):
        """The saved output (latents, images) of an entry's first round, or None: none saved, or damaged."""
        import torch

        from sdperf.store import verified

        def read(path):
            out = torch.load(path, weights_only=True)
            return SimpleNamespace(**out) if isinstance(out, dict) else None

        return verified.load(self._output_path(role, stack, batch_size), read,
                             expect=lambda v: None if v is not None and hasattr(v, "latents") else
                             "it is not a saved output (latents, images)")

    def append(self, record: dict, output=None) -> None:
        """One worker's result (with role, stack, batch_size, round) and, the first time, its output."""
        from sdperf.store import verified

        if output is not None and not self.has_output(record["role"], record["stack"], record["batch_size"]):
            import torch

            verified.write(self._output_path(record["role"], record["stack"], record["batch_size"]),
                           lambda tmp: torch.save({"latents": output.latents, "images": output.images}, tmp))
        if self.sitting is not None:
            record = {**record, "sitting": self.sitting}
        line = json.dumps(record, default=float) + "\n"
        with self._locked():
            if self.sitting is not None and self.sitting not in self._sittings():
                with open(self.root / SITTINGS, "a") as fh:
                    fh.write(f"{self.sitting}\n")
            with open(self.root / RECORDS, "a+b") as fh:
                if fh.seek(0, os.SEEK_END) > 0:  # a line a killed writer cut short is ended first, not extended
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        line = "\n" + line
                fh.write(line.encode())
                fh.flush()
                os.fsync(fh.fileno())
