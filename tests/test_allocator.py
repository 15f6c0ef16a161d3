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


def test_a_preloaded_allocator_carries_onetbbs_workaround_and_default_drops_it(tmp_path, monkeypatch):
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    monkeypatch.setattr(allocator, "find_library", lambda setting: lib)
    env = allocator.environment("tcmalloc", {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "LD_PRELOAD": str(lib), **allocator.PRELOAD_EXTRA}
    assert allocator.environment("default", env) == {"PATH": "/bin"}


OPENVINO_COMPILE = """
import numpy as np, openvino as ov, torch
m = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.ReLU()).eval()
c = ov.Core().compile_model(ov.convert_model(m, example_input=torch.randn(1, 4, 8, 8)), "CPU")
print(c(np.ones((1, 4, 8, 8), dtype="float32"))[0].shape)
"""


@pytest.mark.parametrize("setting", sorted(allocator.PRELOADS))
def test_openvino_compiles_under_each_preloaded_allocator(setting):
    """Without PRELOAD_EXTRA this aborted with "free(): invalid pointer" under both preloads (10's whole-stack
    variants under tcmalloc died with signal 6 in the committed run)."""
    import subprocess
    import sys

    pytest.importorskip("openvino")
    ok, reason = allocator.availability(setting)
    if not ok:
        pytest.skip(reason)
    done = subprocess.run([sys.executable, "-c", OPENVINO_COMPILE], env=allocator.environment(setting),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-600:]
    assert "(1, 8, 6, 6)" in done.stdout


def test_rung_workers_fork_from_one_server_per_allocator_setting(tmp_path):
    """What 10's allocator rung launches (rounds.run starts every process of a run with an allocator key from the fork
    server of its setting, the baseline's from the default setting's, sdperf.measure.allocator_servers): a jemalloc
    worker on the smoke profile measures a whole generation with jemalloc mapped, a baseline worker runs glibc's
    malloc; each setting has one server, which its next worker reuses (the imports are paid once), stop_all ends
    them, and the launcher's own process keeps glibc's malloc throughout."""
    import os

    from sdperf.config.profiles import load_profile
    from sdperf.measure import allocator_servers, lifeline, rounds

    ok, reason = allocator.availability("jemalloc")
    if not ok:
        pytest.skip(reason)
    smoke = load_profile("smoke", check_runtime=False)

    def launch(config):
        spec = rounds._spec(smoke, config, 0, tmp_path / "scratch", {}, save_output=False)
        return rounds.launch(spec, setting=catalog.Stack.of(config.stack).allocator, allocator_server=True,
                             timeout_s=300)

    try:
        (first, output), server = launch(rounds.Config("jemalloc", "allocator:jemalloc")), None
        server = allocator_servers.pid("jemalloc")
        base, _ = launch(rounds.Config(rounds.BASELINE))
        base_server = allocator_servers.pid("default")
        again, _ = launch(rounds.Config("jemalloc", "allocator:jemalloc"))
        assert allocator_servers.pid("jemalloc") == server  # the same server forked the second worker
        assert allocator.in_effect("default") is True and allocator.in_effect("jemalloc") is False  # this process
    finally:
        allocator_servers.stop_all()
    for r in (first, base, again):
        assert r["status"] == "ok", r.get("note")
        assert r["latency_s"] > 0 and r["unet_step_s"] > 0 and r["process_peak_mib"] > 0
        assert r["pid"] not in (os.getpid(), server, base_server)
    assert first["allocator"] == "jemalloc" and first["allocator_in_effect"] is True  # the library is mapped
    assert again["allocator_in_effect"] is True and output is None
    assert base["allocator"] == "default" and base["allocator_in_effect"] is True  # no preload library mapped
    assert server != base_server and not lifeline.alive(server) and not lifeline.alive(base_server)
    assert allocator_servers.pid("jemalloc") is None


def test_in_effect_reads_the_process_map(tmp_path, monkeypatch):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4\n"
                    "7f02-7f03 r--p 0 00:00 0 [heap]\n")
    assert allocator.in_effect("tcmalloc", maps) is True and allocator.in_effect("jemalloc", maps) is False
    assert allocator.in_effect("default", maps) is False and allocator.in_effect("tcmalloc", tmp_path / "no") is None
    # Debian's libtcmalloc_minimal.so.4 is a symlink: the map names the file it resolves to
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n")
    assert allocator.in_effect("tcmalloc", maps) is True and allocator.in_effect("default", maps) is False
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.40\n")
    assert allocator.in_effect("tcmalloc", maps) is False
    for k, v in allocator.GLIBC_TUNED.items():
        monkeypatch.setenv(k, v)
    assert allocator.in_effect("glibc-tuned") is True
