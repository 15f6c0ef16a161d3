"""How `make unit` and `make notebooks` share the machine between their two xdist workers.

The order (`--dist loadscope --no-loadscope-reorder`): the longest scope (a test module, a notebook) first, so the
last scope to start is a short one and neither worker idles long at the end while the other finishes. A scheduling
hint only: a scope not listed runs after the listed ones (notebooks first: each takes 20-40 s on smoke, most unit
modules under 15 s), and a stale list costs idle seconds at the end, never a test. Longest first as measured on the
2-core AMD EPYC (2026-11-28, --durations=0 in both sessions).

The cores: each worker, and every process it starts (notebook kernels, round workers, torchrun ranks, inductor's
compile workers), runs on its own share of the CPUs. OMP_NUM_THREADS=1 does not reach OpenVINO's and NNCF's
thread pools, inductor's compile pool or a training rank's threads, and a 2-thread OpenMP region sharing its two cores
with the other worker's thread stalls at every barrier: on the 2-core Xeon the unit tests took 812 worker-seconds
(432 s wall) with two workers against 465 s wall with one, and 291 s wall pinned (2026-11-28). A
test that needs all the cores (two training ranks) says so with `@pytest.mark.all_cores`, and gets them while it
runs.
"""
from __future__ import annotations

import os

import pytest

LONGEST_FIRST = (
    # notebooks, worker-seconds of nbval on the EPYC, --durations=0 on a fresh clone at 728f633 (2026-11-29): 12 98,
    # 04 78, 11 61, 10 51, 07 47, 08 45, 13 45, 09 45, 03 42, 02 36, 01 33, 00 32, 06 31, 05 19
    "notebooks/12_fid_clip.ipynb", "notebooks/04_torch_compile.ipynb", "notebooks/11_training_scaling.ipynb",
    "notebooks/10_ladder.ipynb", "notebooks/07_engine_export.ipynb", "notebooks/08_quantization.ipynb",
    "notebooks/13_serving.ipynb", "notebooks/09_fewer_steps.ipynb", "notebooks/03_attention.ipynb",
    "notebooks/02_inference_mode.ipynb", "notebooks/01_half_precision.ipynb", "notebooks/00_baseline.ipynb",
    "notebooks/06_deepspeed.ipynb", "notebooks/05_cuda_graphs.ipynb",
    # unit modules, worker-seconds there: 54, 54, 54, 44, 42, 30, 28, 26, 24, 23, 23, 22, 20, 20, and
    # test_opt_torch_compile (45 there; its freezing test then 38.8 s, 28.6 s in CI once it compiled a ResNet block
    # instead of the middle block); the rest under 12
    "tests/test_reference_techniques.py", "tests/test_nncf_alternatives.py", "tests/test_reference_train.py",
    "tests/test_runner.py", "tests/test_opt_engine_export.py", "tests/test_comparison.py",
    "tests/test_training_ddp.py", "tests/test_stage_engines.py", "tests/test_opt_torch_compile.py",
    "tests/test_allocator.py", "tests/test_reference_model.py", "tests/test_imagegen_torchrun.py",
    "tests/test_nncf_hybrid.py", "tests/test_lifeline.py", "tests/test_imagegen_resume.py",
)


ALL_CORES = "all_cores"  # the marker of a test that runs on every CPU (pytest_runtest_setup below)
# Notebooks whose kernel needs every core: 11 launches two training ranks (a rank per core, sdperf.training.launch).
NOTEBOOKS_ON_ALL_CORES = ("notebooks/11_training_scaling.ipynb",)


def _rank(nodeid: str) -> tuple[int, int]:
    scope = nodeid.split("::", 1)[0]
    if scope in LONGEST_FIRST:
        return 0, LONGEST_FIRST.index(scope)
    return (1 if scope.endswith(".ipynb") else 2), 0


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: a scope's own items keep their order
    for item in items:  # a notebook's cells cannot carry a marker: its path gives it
        if item.nodeid.split("::", 1)[0] in NOTEBOOKS_ON_ALL_CORES:
            item.add_marker(ALL_CORES)


ALL_CPUS_ENV = "SDPERF_TEST_ALL_CPUS"  # set only where the workers are pinned: the CPUs they share
_ALL_CPUS: set[int] = set()  # this worker's CPUs before pinning; empty when not pinned
_OWN_CPUS: set[int] = set()


def pytest_configure(config):
    config.addinivalue_line("markers", f"{ALL_CORES}: run on every CPU of the machine, not the xdist worker's share "
                                       "(two training ranks need two cores)")
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if int(count) < 2 or len(cpus) < int(count):
        return
    _ALL_CPUS.update(cpus)
    os.environ[ALL_CPUS_ENV] = ",".join(map(str, cpus))  # what tests/test_worker_cores.py checks the shares against
    _OWN_CPUS.update(cpus[int(worker.removeprefix("gw")) % int(count)::int(count)])  # gw0: 0, 2, ..; gw1: 1, 3, ..
    os.sched_setaffinity(0, _OWN_CPUS)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the item's fixtures (and a notebook's kernel) start: every CPU for an all_cores item, else the
    worker's own share; children inherit it."""
    if _ALL_CPUS:
        os.sched_setaffinity(0, _ALL_CPUS if item.get_closest_marker(ALL_CORES) else _OWN_CPUS)
