"""`sdperf generate` under torchrun: 2 ranks write exactly the files (same bytes) and manifest that 1 rank writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from sdperf.imagegen import generate_folder, read_manifest
from sdperf.model.prompts import load_captions

GUIDANCE = ["1", "7.5"]


def _files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.glob("g*/*.png"))}


def test_two_torchrun_ranks_write_the_same_files_and_pixels_as_one_rank(smoke, tiny_pipe, tmp_path):
    prompts = tmp_path / "captions.txt"
    prompts.write_text("a red bicycle against a wall\ntwo dogs on a beach\na bowl of oranges\n")
    two = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "sdperf.cli",
           "generate", "--profile", "smoke", "--prompts", str(prompts), "--out", str(two), "--guidance", *GUIDANCE]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]

    one = tmp_path / "one"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun rank: the same kernels, so the same float rounding
    try:
        generate_folder(smoke, load_captions(prompts), one, [float(g) for g in GUIDANCE], pipe=tiny_pipe,
                        progress=False)
    finally:
        torch.set_num_threads(threads)

    assert len(_files(one)) == 6 and _files(two) == _files(one)
    cols = ["key", "prompt_id", "caption", "guidance", "seed", "file"]
    assert read_manifest(two)[cols].equals(read_manifest(one)[cols])
    summary = json.loads((two / "summary.json").read_text())
    assert summary["world_size"] == 2 and [r["generated"] for r in summary["ranks"]] == [3, 3]
    assert all(r["images_per_s"] > 0 for r in summary["ranks"]) and summary["images_per_s"] > 0
    assert proc.stdout.count("generated 6 images (6 planned)") == 1  # the summary, printed once (rank 0)
    assert "rank 0" in proc.stderr and "rank 1" in proc.stderr and "all ranks" in proc.stderr  # progress bars
