"""Exported engine artefacts kept on disk between the worker processes of one comparison.

Every configuration runs in a fresh process in every round (sdperf.measure.rounds), so without a cache each round would
export SD 1.5's UNet again (tens of seconds, 3.4 GB of ONNX). Each comparison gets a folder of its own
(Context.artefacts, made and removed by comparison.run_variants); the first worker builds an artefact into a
folder named by what determines it (engine, exporter, input shapes, the library versions and a digest of the
UNet's weights), and later workers load it. The folder appears under its final name only once complete (built
under a temporary name, then renamed), so a killed build never leaves a half-written engine that a later worker
would load. Set-up time then reads "built" in the first round and "loaded" in the others: the worker reports
both (rounds.summarize: setup_s of the first round, setup_warm_s of the later ones).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch

from sdperf.core.environment import package_versions

DONE = "artefact.json"
PACKAGES = ("torch", "onnx", "onnxscript", "onnxruntime", "openvino", "nncf")


def weights_digest(module: torch.nn.Module) -> str:
    """A digest of every tensor's name, shape, dtype, sum and sum of squares: equal weights give equal digests
    (the study's weights are seeded), different weights practically never do, and it costs one pass over them."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in module.state_dict().items():
            x = t.detach().double()
            h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|{x.sum().item():.17g}|{(x * x).sum().item():.17g}".encode())
    return h.hexdigest()[:16]


def cache_key(kind: str, module: torch.nn.Module, **what) -> str:
    """The folder name of an artefact: its kind and a hash of everything that determines its content."""
    spec = json.dumps({"kind": kind, "weights": weights_digest(module), "versions": package_versions(PACKAGES), **what},
                      sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(spec.encode()).hexdigest()[:16]}"


def cached(root: Path | str, key: str, build: Callable[[Path], dict]) -> tuple[Path, dict, bool]:
    """(folder, facts, hit): the complete artefact `key` under `root`, built by `build(folder) -> facts` when
    absent. A build that raises leaves nothing behind."""
    root = Path(root)
    final = root / key
    if (final / DONE).is_file():
        return final, json.loads((final / DONE).read_text()), True
    shutil.rmtree(final, ignore_errors=True)  # not ours to trust: only complete folders carry DONE
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    try:
        facts = build(tmp)
        (tmp / DONE).write_text(json.dumps(facts, default=str))
        try:
            os.replace(tmp, final)
        except OSError:  # another worker finished the same artefact first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
            return final, json.loads((final / DONE).read_text()), True
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, facts, False


def clear(root: Path | str) -> None:
    """Drop the folder of one comparison's engines (not reused by the next comparison: its shapes may differ,
    and SD 1.5 engines are gigabytes each). Each comparison has a folder of its own, so clearing one never
    pulls an engine from under another comparison running at the same time."""
    shutil.rmtree(Path(root), ignore_errors=True)
