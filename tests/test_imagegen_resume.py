"""A generate run SIGKILLed part-way and restarted with the same arguments: every key once, nothing rewritten."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from sdperf.imagegen import plan_keys, read_manifest

GUIDANCE = ["1", "3", "7.5"]
CAPTIONS = ["a red bicycle against a wall", "two dogs on a beach", "a bowl of oranges", "a clock tower"]


def _stamps(folder) -> dict[str, tuple[int, int]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("g*/*.png")}


def test_killed_run_restarts_to_every_key_once_without_rewriting_any_image(tmp_path):
    prompts = tmp_path / "captions.txt"
    prompts.write_text("\n".join(CAPTIONS) + "\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "sdperf.cli", "generate", "--profile", "smoke", "--prompts", str(prompts),
           "--out", str(out), "--guidance", *GUIDANCE, "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while len(_stamps(out)) < 3 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    run.send_signal(signal.SIGKILL)  # mid-run: wherever it is (writing a temp file, renaming, appending a row)
    run.wait()
    assert run.returncode == -signal.SIGKILL, run.stderr.read().decode()[-2000:]
    before = _stamps(out)
    keys = plan_keys([str(i) for i in range(1, len(CAPTIONS) + 1)], [float(g) for g in GUIDANCE], base_seed=0)
    assert 3 <= len(before) < len(keys), "the kill should land part-way"

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    after = _stamps(out)
    assert {f: after[f] for f in before} == before, "an image of the killed run was rewritten"
    assert set(after) == {k.relpath for k in keys}
    assert not list(out.rglob("*.tmp")), "a half-written temp file was left behind"
    table = read_manifest(out)
    assert list(table["file"]) == [k.relpath for k in keys]  # every key once, sorted: no duplicates, no holes
    summary = json.loads((out / "summary.json").read_text())["ranks"][0]
    assert summary["already_done"] == len(before) and summary["generated"] == len(keys) - len(before)
    assert f"generated {len(keys) - len(before)} images ({len(keys)} planned)" in rerun.stdout
