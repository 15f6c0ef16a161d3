"""Launch settings fail before anything is spawned; a configuration that dies becomes a row with its own error."""
from __future__ import annotations

import dataclasses

import pytest

from sdperf.core.errors import ConfigError
from sdperf.training import launch, training_settings


@pytest.fixture
def no_spawn(monkeypatch):
    """Any attempt to start a process fails the test: validation must come first."""
    def spawn(*a, **k):
        raise AssertionError("a process was spawned before the launch settings were validated")
    monkeypatch.setattr(launch.subprocess, "Popen", spawn)


@pytest.fixture(scope="module")
def smoke_settings(smoke):
    return training_settings.from_profile(smoke)


def test_world_size_larger_than_the_cores_fails_naming_the_valid_sizes(smoke, smoke_settings, no_spawn):
    cores = launch.usable_cores()
    config = launch.Config("ddp", cores + 1, 1, 1)
    with pytest.raises(ConfigError) as err:
        launch.run_config(smoke, smoke_settings, config, None)
    msg = str(err.value)
    assert f"world size {cores + 1}" in msg and f"{cores} CPU cores" in msg
    assert "valid world sizes on this machine: " + ", ".join(map(str, range(1, cores + 1))) in msg


def test_a_sweep_with_one_bad_world_size_fails_before_the_first_run(smoke, smoke_settings, no_spawn):
    with pytest.raises(ConfigError, match=f"world size {launch.usable_cores() + 1} is larger"):
        launch.plan(smoke, smoke_settings, world_sizes=[1, launch.usable_cores() + 1])


@pytest.mark.parametrize("backend,expected", [
    ("mpi", "backend 'mpi' is not valid; choose one of: auto, gloo, nccl"),
    ("nccl", "backend 'nccl' needs CUDA devices and this run is on 'cpu'; choose one of: gloo, auto"),
])
def test_unknown_or_impossible_backend_fails(smoke, smoke_settings, no_spawn, backend, expected):
    s = dataclasses.replace(smoke_settings, backend=backend)
    with pytest.raises(ConfigError) as err:
        launch.run_config(smoke, s, launch.Config("ddp", 1, 1, 1), None)
    assert expected in str(err.value)


@pytest.mark.parametrize("batch", [0, -2, 1.5])
def test_bad_batch_size_fails(batch):
    with pytest.raises(ConfigError, match=rf"per-rank batch size must be an integer >= 1, got {batch!r}"):
        launch.check_launch(1, batch, "gloo", "cpu")


def test_unknown_engine_fails():
    with pytest.raises(ConfigError, match="engine 'zero3' is not valid; choose one of: ddp, zero1, zero2"):
        launch.check_launch(1, 1, "gloo", "cpu", engine="zero3")


def test_backend_auto_resolves_by_device():
    assert launch.resolve_backend("auto", "cpu") == "gloo"
    assert launch.resolve_backend("auto", "cuda") == "nccl"


def test_threads_are_split_between_ranks(monkeypatch):
    monkeypatch.setattr(launch, "usable_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [launch.threads_per_rank("cpu", w) for w in (1, 2, 4, 8)] == [8, 4, 2, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the caller's thread budget caps the split
    assert [launch.threads_per_rank("cpu", w) for w in (1, 2, 4)] == [2, 1, 1]


def test_plan_adds_the_control_and_zero_runs(smoke, smoke_settings, monkeypatch):
    monkeypatch.setattr(launch, "usable_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    sweep = dataclasses.replace(smoke_settings, world_sizes=(1, 2), batch_sizes=(1, 2))  # the cpu profile's sweep
    configs = launch.plan(smoke, dataclasses.replace(sweep, deepspeed_zero_stages=(1, 2), equal_threads_control=True))
    labels = [c.label for c in configs]
    assert labels == ["ddp, world 1, batch 1/rank", "ddp, world 1, batch 2/rank", "ddp, world 2, batch 1/rank",
                      "ddp, world 2, batch 2/rank",
                      "ddp, world 1, batch 1/rank, 1 thread(s) (equal-threads control)",
                      "ddp, world 1, batch 2/rank, 1 thread(s) (equal-threads control)",
                      "zero1, world 2, batch 1/rank", "zero2, world 2, batch 1/rank"]
    assert [c.threads_per_rank for c in configs[:4]] == [2, 2, 1, 1]
    off = launch.plan(smoke, dataclasses.replace(sweep, deepspeed_zero_stages=(1,), equal_threads_control=False))
    assert [c.label for c in off] == labels[:4] + ["zero1, world 2, batch 1/rank"]  # no control, the rest as before


def test_error_line_finds_the_workers_root_cause():
    out = ("[rank1]: Traceback (most recent call last):\n"
           "[rank1]:   File \"x.py\", line 1, in <module>\n"
           "[rank1]: FileNotFoundError: [Errno 2] No such file or directory: '/x/latents.pt'\n"
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
           "sdperf.training.train FAILED\n")
    assert launch.error_line(out) == "FileNotFoundError: [Errno 2] No such file or directory: '/x/latents.pt'"
    assert launch.error_line("just a last line\n") == "just a last line"


def test_a_configuration_that_dies_becomes_a_failed_row_with_its_error(smoke, smoke_settings, tmp_path):
    missing = tmp_path / "no-such-latents.pt"
    row = launch.run_config(smoke, smoke_settings, launch.Config("ddp", 1, 1, 1), missing)
    assert row["status"] == "failed"
    assert "FileNotFoundError" in row["note"] and "no-such-latents.pt" in row["note"]


def test_fp16_autocast_under_zero_is_not_applicable_without_spawning(smoke, smoke_settings, no_spawn):
    s = dataclasses.replace(smoke_settings, autocast="float16")
    row = launch.run_config(smoke, s, launch.Config("zero1", 1, 1, 1), None)
    assert row["status"] == "not_applicable" and "loss scaler" in row["note"]


def test_zero_runs_skip_deepspeeds_shared_memory_comm_build(monkeypatch):
    """DeepSpeed JIT-compiles its CPU shared-memory all-reduce in init_distributed (25-40 s of g++ per new venv),
    which ZeRO training never calls: marked unavailable, init_distributed's builder returns None without building."""
    import importlib

    deepspeed_ops = pytest.importorskip("deepspeed.ops")
    ds_torch = importlib.import_module("deepspeed.comm.torch")  # deepspeed.comm's `torch` attribute is torch itself
    from deepspeed.accelerator import get_accelerator

    from sdperf.training import zero

    table = deepspeed_ops.__compatible_ops__
    monkeypatch.setitem(table, zero.SHM_COMM_OP, table.get(zero.SHM_COMM_OP, False))  # restored after the test

    def no_build(*_a, **_k):
        raise AssertionError("the shared-memory comm op was built")
    monkeypatch.setattr(type(get_accelerator().create_op_builder("ShareMemCommBuilder")), "load", no_build)
    zero.without_shm_comm()
    assert table[zero.SHM_COMM_OP] is False and ds_torch.build_shm_op() is None
