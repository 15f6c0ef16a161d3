"""The run's artefact cache: a complete folder or nothing, keyed by the weights and what else determines it."""
from __future__ import annotations

import pytest
import torch

from sdperf.optimizations import artefacts


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_key_follows_the_weights_and_the_shapes():
    a, b = _net(0), _net(1)
    assert artefacts.cache_key("onnx", a, shapes=[(2, 4)]) == artefacts.cache_key("onnx", _net(0), shapes=[(2, 4)])
    assert artefacts.cache_key("onnx", a, shapes=[(2, 4)]) != artefacts.cache_key("onnx", b, shapes=[(2, 4)])
    assert artefacts.cache_key("onnx", a, shapes=[(2, 4)]) != artefacts.cache_key("onnx", a, shapes=[(4, 4)])
    assert artefacts.cache_key("onnx", a) != artefacts.cache_key("openvino-ir", a)


def test_built_once_then_loaded(tmp_path):
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "model.bin").write_bytes(b"weights")
        return {"export_s": 1.5}

    first = artefacts.cached(tmp_path, "k", build)
    second = artefacts.cached(tmp_path, "k", build)
    assert len(calls) == 1 and first[1:] == ({"export_s": 1.5}, False) and second[1:] == ({"export_s": 1.5}, True)
    assert (second[0] / "model.bin").read_bytes() == b"weights"


def test_a_failed_or_interrupted_build_leaves_nothing_that_loads(tmp_path):
    def broken(folder):
        (folder / "model.bin").write_bytes(b"half")
        raise KeyboardInterrupt  # a kill in the middle of an export

    with pytest.raises(KeyboardInterrupt):
        artefacts.cached(tmp_path, "k", broken)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "k").mkdir()  # a folder without its completion record (copied in by hand, say)
    (tmp_path / "k" / "model.bin").write_bytes(b"stale")
    folder, _, hit = artefacts.cached(tmp_path, "k", lambda f: (f / "model.bin").write_bytes(b"new") and {})
    assert not hit and (folder / "model.bin").read_bytes() == b"new"
    artefacts.clear(tmp_path)
    assert not tmp_path.exists()
