"""The run's artefact cache: a complete folder or nothing, keyed by the weights and what else determines it."""
from __future__ import annotations

import pytest
import torch

from sdperf.core import environment
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


def test_the_weights_digest_sees_one_ulp_a_dtype_and_a_buffer():
    """Exact bytes: a change too small for float64 sums of the weights (one ulp of one weight) is a new key, and so
    are another dtype and a changed buffer (BatchNorm's 0-d step count)."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    digest = artefacts.weights_digest(net)
    twin = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    twin.load_state_dict(net.state_dict())
    assert artefacts.weights_digest(twin) == digest
    with torch.no_grad():
        w = twin[0].weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf")))
    assert artefacts.weights_digest(twin) != digest
    twin.load_state_dict(net.state_dict())
    twin[1].num_batches_tracked += 1
    assert artefacts.weights_digest(twin) != digest
    assert artefacts.weights_digest(net.to(torch.bfloat16)) != digest


def test_built_once_then_loaded(tmp_path):
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "model.bin").write_bytes(b"weights")
        return {"export_s": 1.5}

    first = artefacts.cached(tmp_path, "k", build)
    second = artefacts.cached(tmp_path, "k", build)
    built = {"export_s": 1.5, "built_by": environment.run_id()}  # the run that built it: said on a later run's load
    assert len(calls) == 1 and first[1:] == (built, False) and second[1:] == (built, True)
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


def test_the_cross_run_cache_names_the_run_that_built_an_artefact_and_keeps_within_its_cap(tmp_path, monkeypatch):
    """A later run loads what an earlier one built and says so, with that build's time; the shared folder is
    trimmed least recently used first; a cap of 0 gives each comparison a private folder that is removed."""
    import os

    monkeypatch.setenv("SDPERF_RUN_ID", "run-1")
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path))
    scratch = tmp_path / "smoke" / ".scratch"  # the profile's scratch folder: trimmed only inside the reports folder
    root, shared = artefacts.root_for(scratch, "07")
    assert shared and root == artefacts.shared_root(scratch)
    a, b = "ir-000000000000000a", "ir-000000000000000b"

    def build(size):
        def make(folder):
            (folder / "blob").write_bytes(b"x" * size)
            return {"export_s": 12.5}
        return make

    _, facts, hit = artefacts.cached(root, a, build(1000))
    assert not hit and artefacts.origin(facts, hit) == "converted into the run's cache"
    assert artefacts.origin(*artefacts.cached(root, a, build(1000))[1:]) == "loaded from the run's cache"
    monkeypatch.setenv("SDPERF_RUN_ID", "run-2")
    _, facts, hit = artefacts.cached(root, a, build(1000))
    assert hit and artefacts.origin(facts, hit) == "loaded from the cache of an earlier run (run-1; its build took 12 s)"
    artefacts.cached(root, b, build(1000))
    os.utime(root / b / artefacts.DONE, (1, 1))  # b: least recently used
    (root / artefacts.PLUGIN_CACHE).mkdir()
    (root / artefacts.PLUGIN_CACHE / "blob.bin").write_bytes(b"y" * 500)
    assert artefacts.trim(root, 1800) == [b] and (root / a).is_dir()
    monkeypatch.setenv(artefacts.CACHE_ENV, "0")
    private, shared = artefacts.root_for(scratch, "07")
    assert not shared and private != root
    private.mkdir(parents=True)
    artefacts.release(private, shared)
    assert not private.exists() and (root / a).is_dir()
    monkeypatch.setenv(artefacts.CACHE_ENV, "lots")
    with pytest.raises(Exception, match="SDPERF_ENGINE_CACHE_GIB='lots'"):
        artefacts.cache_gib()
