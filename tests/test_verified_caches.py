"""Every cache entry is checked before use (sdperf.store.verified, issue 61): each cache kind damaged three ways (its
bytes changed at the same size, truncated, its record unreadable or not what the caller expects) is set aside and
built again, never loaded; a cache write that fails keeps the result computed."""
from __future__ import annotations

import errno
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from sdperf.measure import ledger as ledgers
from sdperf.optimizations import artefacts
from sdperf.judge import converged
from sdperf.judge.converged import Solve, Solver
from sdperf.store import verified


def _flip(path: Path) -> None:
    """The same size, other bytes: what a size or count check cannot see."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 3)])


DAMAGE = {"flipped": _flip, "truncated": _truncate, "unsealed": lambda p: Path(str(p) + verified.SEAL).unlink()}


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_file_is_set_aside_and_not_read(tmp_path, how):
    path = tmp_path / "entry.bin"
    assert verified.write(path, lambda tmp: Path(tmp).write_bytes(b"x" * 4096))
    assert verified.load(path, Path.read_bytes) == b"x" * 4096
    DAMAGE[how](path)
    with pytest.warns(UserWarning, match="set aside"):
        assert verified.load(path, Path.read_bytes) is None
    assert not path.exists() and any((tmp_path / verified.QUARANTINE).iterdir())
    assert verified.load(path, Path.read_bytes) is None  # nothing left to read: rebuilt by the caller


def test_a_sealed_entry_the_reader_refuses_is_set_aside_too(tmp_path):
    path = tmp_path / "entry.json"
    verified.write(path, lambda tmp: Path(tmp).write_text("[]"))
    with pytest.warns(UserWarning, match="not a mapping"):
        assert verified.load(path, lambda p: json.loads(p.read_text()),
                             expect=lambda v: None if isinstance(v, dict) else "not a mapping") is None


def test_a_failed_cache_write_warns_names_a_full_disk_and_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "entry.bin"

    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.warns(UserWarning, match=r"not stored \(the disk is full\).*kept"):
        assert verified.write(path, full) is False
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- the seeded weights of a random-init pipeline

@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_seeded_weights_are_rebuilt_equal_to_a_fresh_build(smoke, tmp_path, how):
    from sdperf.model.pipelines import build_pipeline

    fresh = build_pipeline(smoke)
    build_pipeline(smoke, weights_cache=tmp_path)
    files = sorted(tmp_path.glob("*.safetensors"))
    assert files and all(Path(str(f) + verified.SEAL).is_file() for f in files)
    DAMAGE[how](files[0])
    with pytest.warns(UserWarning, match="set aside"):
        again = build_pipeline(smoke, weights_cache=tmp_path)
    for name in ("unet", "vae", "text_encoder"):
        for (k, a), b in zip(getattr(fresh, name).state_dict().items(), getattr(again, name).state_dict().values()):
            assert torch.equal(a, b), (name, k)
    assert verified.check(files[0]) is None  # stored again, sealed


def test_seeded_weights_of_other_shapes_are_refused_even_when_sealed(smoke, tmp_path):
    from safetensors.torch import load_file, save_file

    from sdperf.model.pipelines import build_pipeline

    build_pipeline(smoke, weights_cache=tmp_path)
    path = sorted(tmp_path.glob("*unet*.safetensors"))[0]
    tensors = load_file(str(path))
    name = next(k for k, v in tensors.items() if v.ndim == 4)
    tensors[name] = tensors[name].double()  # float64: what a forger's seal cannot make right
    verified.write(path, lambda tmp: save_file(tensors, tmp))
    with pytest.warns(UserWarning, match="shape or dtype"):
        pipe = build_pipeline(smoke, weights_cache=tmp_path)
    assert all(p.dtype == torch.float32 for p in pipe.unet.parameters())


# ---------------------------------------------------------------- an engine artefact (a folder)

def _build(calls: list):
    def build(folder: Path) -> dict:
        calls.append(folder)
        (folder / "unet.xml").write_text("<net/>")
        (folder / "unet.bin").write_bytes(np.arange(4096, dtype=np.float32).tobytes())
        return {"export_s": 1.0}
    return build


@pytest.mark.parametrize("how", ["flipped", "truncated", "record"])
def test_a_damaged_engine_is_built_again_and_the_facts_say_why(scratch_reports, how):
    tmp_path = artefacts.shared_root(scratch_reports / "smoke" / ".scratch")  # trim cleans only inside reports/
    calls = []
    folder, facts, hit = artefacts.cached(tmp_path, "openvino-ir-0123456789abcdef", _build(calls))
    assert not hit and (folder / verified.FOLDER_SEAL).is_file()
    assert artefacts.cached(tmp_path, "openvino-ir-0123456789abcdef", _build(calls))[2]  # intact: a hit
    if how == "record":
        (folder / artefacts.DONE).write_text("{not json")
    else:
        DAMAGE[how](folder / "unet.bin")
    with pytest.warns(UserWarning, match="set aside"):
        folder, facts, hit = artefacts.cached(tmp_path, "openvino-ir-0123456789abcdef", _build(calls))
    assert not hit and len(calls) == 2 and "set aside" in facts["rebuilt"]
    assert "(the cached artefact was set aside" in artefacts.origin(facts, hit)
    assert (folder / "unet.bin").read_bytes() == np.arange(4096, dtype=np.float32).tobytes()
    gone = artefacts.trim(tmp_path, 10**12)  # the damaged copy goes at the next trim, whatever the cap
    assert gone and all(g.startswith(verified.QUARANTINE) for g in gone)


def test_a_file_added_to_an_engine_is_refused(tmp_path):
    folder, _, _ = artefacts.cached(tmp_path, "openvino-ir-0123456789abcdef", _build([]))
    (folder / "extra.py").write_text("print('ran')")
    with pytest.warns(UserWarning, match="files differ"):
        assert not artefacts.cached(tmp_path, "openvino-ir-0123456789abcdef", _build([]))[2]


def test_openvinos_compiled_blobs_are_sealed_and_a_changed_one_is_deleted_before_a_compile(tmp_path):
    pytest.importorskip("openvino")
    from sdperf.measure.roofline import openvino_matmul_model
    from sdperf.optimizations.openvino_engine import compile_model

    x, w = np.ones((4, 8), np.float32), np.ones((8, 4), np.float32)
    compile_model(openvino_matmul_model(x, w, "f32"), "f32", cache_dir=tmp_path)
    blobs = [p for p in tmp_path.iterdir() if p.name != verified.FOLDER_SEAL]
    assert blobs and (tmp_path / verified.FOLDER_SEAL).is_file()
    for b in blobs:
        b.write_bytes(b.read_bytes()[:64] + np.random.default_rng(0).bytes(4096))
    with pytest.warns(UserWarning, match="deleted, and are compiled again"):
        compiled, _ = compile_model(openvino_matmul_model(x, w, "f32"), "f32", cache_dir=tmp_path)
    out = compiled.create_infer_request().infer({"x": x})[0]
    assert np.array_equal(out, x @ w)
    assert verified.prune_folder(tmp_path)[0] == []  # sealed again after the compile


# ---------------------------------------------------------------- the converged solves and the judged renders

def _solver(tmp_path, made: list) -> Solver:
    def render(sampler, steps, captions, seeds):
        made.append(len(captions))
        g = torch.Generator().manual_seed(seeds[0])
        return Solve(torch.randn(len(captions), 4, 8, 8, generator=g),
                     np.full((len(captions), 16, 16, 3), 7, np.uint8))
    return Solver(render=render, model_hash="m", guidance=7.5, cache=tmp_path)


def _resealed(path: Path, **arrays) -> None:
    """Sealed again after a change: what only the shape and dtype checks can catch."""
    converged.store(path, Solve(torch.from_numpy(arrays["latents"]), arrays["images"]))


@pytest.mark.parametrize("how", ["flipped", "truncated", "float64", "nan", "count"])
def test_a_damaged_converged_chunk_is_solved_again(tmp_path, how):
    made = []
    s = _solver(tmp_path, made)
    first = s.solve(["a", "b"], [1, 2], 25)
    (path,) = tmp_path.glob("*.npz")
    assert s.solve(["a", "b"], [1, 2], 25).latents.equal(first.latents) and made == [2]  # a hit
    lat, img = first.latents.numpy(), first.images
    if how in DAMAGE:
        DAMAGE[how](path)
    elif how == "float64":
        _resealed(path, latents=lat.astype(np.float64), images=img)
    elif how == "nan":
        _resealed(path, latents=np.where(lat > 1, np.nan, lat).astype(np.float32), images=img)
    else:
        _resealed(path, latents=lat[:1], images=img[:1])
    with pytest.warns(UserWarning, match="set aside"):
        again = s.solve(["a", "b"], [1, 2], 25)
    assert made == [2, 2] and again.latents.equal(first.latents)


def test_a_damaged_render_chunk_is_rendered_again(tmp_path):
    from sdperf.judge.renders import Cache

    r = Cache(folder=tmp_path, model_hash="m", machine="x", key="tome:0.5", steps=10, guidance=7.5, call={},
              facts={"build_s": 1.0})
    solve = Solve(torch.zeros(2, 4, 8, 8), np.zeros((2, 16, 16, 3), np.uint8))
    r.put(["a", "b"], [1, 2], solve)
    assert r.get(["a", "b"], [1, 2]) is not None and r.hits == 2
    (path,) = tmp_path.glob("*.npz")
    _truncate(path)  # once BadZipFile, past the reader's except
    with pytest.warns(UserWarning, match="set aside"):
        assert r.get(["a", "b"], [1, 2]) is None


# ---------------------------------------------------------------- a ledger's saved outputs

@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_ledger_output_is_set_aside_and_saved_again(tmp_path, how):
    from types import SimpleNamespace

    book = ledgers.Ledger(tmp_path)
    out = SimpleNamespace(latents=torch.ones(1, 4, 8, 8), images=torch.zeros(1, 16, 16, 3, dtype=torch.uint8))
    record = {"role": ledgers.BASELINE_ROLE, "stack": "fp32-eager", "batch_size": 1, "round": 0, "status": "ok"}
    book.append(record, out)
    assert book.output(ledgers.BASELINE_ROLE, "fp32-eager", 1).latents.equal(out.latents)
    (path,) = (tmp_path / "outputs").glob("*.pt")
    DAMAGE[how](path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert not book.has_output(ledgers.BASELINE_ROLE, "fp32-eager", 1)
    assert any("set aside" in str(w.message) for w in seen)
    book.append(dict(record, round=1), out)  # the next worker of the entry saves its own
    assert book.output(ledgers.BASELINE_ROLE, "fp32-eager", 1).latents.equal(out.latents)


def test_an_engine_build_that_meets_a_full_disk_says_so(tmp_path, monkeypatch):
    """OpenVINO's serializer says only `basic_ios::clear: iostream error` when the disk is full."""
    import collections
    import shutil

    def build(folder):
        raise RuntimeError("Exception from src/core/src/pass/serialize.cpp: basic_ios::clear: iostream error")

    monkeypatch.setattr(shutil, "disk_usage", lambda _p: collections.namedtuple("u", "total used free")(1, 1, 2**20))
    with pytest.raises(OSError, match=r"has 1 MiB free .*basic_ios::clear.*SDPERF_ENGINE_CACHE_GIB=0"):
        artefacts.cached(tmp_path, "openvino-ir-0123456789abcdef", build)
    assert not any(tmp_path.iterdir())  # the half-built folder is gone
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: collections.namedtuple("u", "total used free")(1, 1, 2**40))
    with pytest.raises(RuntimeError, match="iostream error"):  # plenty of room: the library's own error stands
        artefacts.cached(tmp_path, "openvino-ir-0123456789abcdef", build)
