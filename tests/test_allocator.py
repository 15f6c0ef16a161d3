"""The allocator rung: which settings can run here, the environment a fresh process gets, and that a fresh
process measures the same picture."""
from __future__ import annotations

import pytest
import torch

from sdperf import fresh_process
from sdperf.optimizations import allocator


def test_bad_setting_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"allocator 'hoard' is not valid; choose one of: default, glibc-tuned"):
        allocator.availability("hoard")


def test_missing_preload_library_is_not_applicable_with_the_package_to_install(monkeypatch):
    monkeypatch.setattr(allocator, "find_library", lambda setting: None)
    ok, reason = allocator.availability("jemalloc")
    assert not ok and "apt-get install libjemalloc2" in reason
    with pytest.raises(ValueError, match="cannot be used here"):
        allocator.environment("jemalloc")


def test_environment_replaces_inherited_allocator_settings(tmp_path, monkeypatch):
    base = {"PATH": "/bin", "MALLOC_ARENA_MAX": "2", "LD_PRELOAD": "/x.so"}
    assert allocator.environment("default", base) == {"PATH": "/bin"}
    tuned = allocator.environment("glibc-tuned", base)
    assert tuned == {"PATH": "/bin", **allocator.GLIBC_TUNED}
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    monkeypatch.setattr(allocator, "find_library", lambda setting: lib)
    assert allocator.environment("jemalloc", base)["LD_PRELOAD"] == str(lib)


def test_fresh_processes_measure_the_same_picture_under_each_allocator():
    default = fresh_process.measure("smoke", "default", timeout_s=600)
    tuned = fresh_process.measure("smoke", "glibc-tuned", timeout_s=600)
    assert torch.equal(default.latents, tuned.latents) and torch.equal(default.images, tuned.images)
    for run in (default, tuned):
        assert run.summary["latency_s"] > 0 and run.summary["p10_s"] <= run.summary["p90_s"]
        assert run.faults_per_generation is not None and run.faults_per_generation >= 0


def test_a_failing_child_reports_its_error():
    with pytest.raises(RuntimeError, match=r"fresh process \(default\) exited 1: .*unknown profile 'nope'"):
        fresh_process.measure("nope", "default", timeout_s=120)
