"""The allocator rung: which settings can run here, the environment a fresh process gets, and the catalog keys
that make sdperf.measure.rounds start a configuration's processes under a setting."""
from __future__ import annotations

import pytest

from sdperf.optimizations import allocator, catalog


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


def test_allocator_keys_set_the_process_setting_of_a_stack():
    assert catalog.keys(family=catalog.ALLOCATOR) == ["allocator:glibc-tuned", "allocator:jemalloc",
                                                       "allocator:tcmalloc"]
    assert catalog.Stack.of("grad:no_grad+allocator:jemalloc").allocator == "jemalloc"
    assert catalog.Stack.of("grad:no_grad").allocator == "default"
