"""The machine record beside every number: thread settings as torch reports them, the allocator this process runs
on, the GPU (or why there is none), and the report's environment table showing them."""
from __future__ import annotations

import os

import pytest
import torch

from sdperf.core import environment
from sdperf.report import report


@pytest.fixture(scope="module")
def env():
    return environment.record("smoke", "cpu")


def test_thread_settings_are_torchs_own(env, monkeypatch):
    threads = env["thread_settings"]
    assert threads["intra_op_threads"] == torch.get_num_threads() == env["threads"]
    assert threads["inter_op_threads"] == torch.get_num_interop_threads()
    assert threads["parallel_backend"] in torch.__config__.parallel_info()
    assert threads["parallel_backend"] != "unknown"
    assert set(threads["env"]) == set(environment.THREAD_ENV)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("KMP_AFFINITY", raising=False)
    now = environment.thread_settings()["env"]
    assert now["OMP_NUM_THREADS"] == "3" and now["KMP_AFFINITY"] == "unset"


def test_parallel_info_lines_are_read_by_label():
    info = ("ATen/Parallel:\n\tat::get_num_threads() : 2\nOpenMP 201511 (a.k.a. OpenMP 4.5)\n"
            "\tomp_get_max_threads() : 7\nATen parallel backend: native thread pool\n")
    assert environment._parallel_line(info, "omp_get_max_threads()") == "7"
    assert environment._parallel_line(info, "ATen parallel backend") == "native thread pool"
    assert environment._parallel_line(info, "mkl_get_max_threads()") is None


def test_allocator_is_read_from_the_mapped_libraries(env, tmp_path):
    assert env["allocator"] == environment.allocator()
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
                    "7f02-7f03 r-xp 00000000 08:01 43 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
                    "7f04-7f05 rw-p 00000000 00:00 0 [heap]\n")
    assert environment.allocator(maps) == "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert environment.allocator(maps) == "glibc malloc"
    preloaded = os.environ.get("LD_PRELOAD", "")
    if "jemalloc" not in preloaded and "tcmalloc" not in preloaded:
        assert env["allocator"] == "glibc malloc"


def test_gpu_is_recorded_or_said_not_applicable(env):
    if not torch.cuda.is_available():
        assert env["gpu"] == environment.NO_GPU == "not applicable: no CUDA device"
        return
    gpu = env["gpu"]
    assert gpu["name"] == torch.cuda.get_device_name(0) and gpu["count"] == torch.cuda.device_count()
    assert gpu["driver"] and gpu["runtime"].endswith(str(torch.version.cuda or torch.version.hip))


def test_the_report_shows_the_new_fields_and_says_when_a_record_lacks_them(env):
    html = report._environment_section(env, {})
    gpu_shown = env["gpu"] if isinstance(env["gpu"], str) else env["gpu"]["name"]
    for shown in ("threads: inter op threads", env["thread_settings"]["parallel_backend"], "allocator",
                  env["allocator"], gpu_shown):
        assert shown in html, shown
    old = {k: v for k, v in env.items() if k not in ("thread_settings", "allocator", "gpu", "cpu_caches")}
    facts = report._threads_allocator_gpu_facts(old)
    assert set(facts.values()) == {report.NOT_RECORDED}
    assert "<td>cpu_caches</td>\n      <td>" + report.NOT_RECORDED in report._environment_section(old, {})
    gpu = {"name": "NVIDIA H100 80GB HBM3", "driver": "550.54.15", "runtime": "CUDA 12.4"}
    facts = report._threads_allocator_gpu_facts({**env, "gpu": gpu})
    assert facts["GPU name"] == "NVIDIA H100 80GB HBM3" and facts["GPU driver"] == "550.54.15"
