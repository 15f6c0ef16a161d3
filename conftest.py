"""The order in which `make unit` and `make notebooks` hand their scopes (a test module, a notebook) to the two xdist
workers (`--dist loadscope --no-loadscope-reorder`): the longest first, so the last scope to start is a short one
and neither worker idles long at the end while the other finishes. A scheduling hint only: a scope not listed runs
after the listed ones (notebooks first: each takes 20-40 s on smoke, most unit modules under 15 s), and a stale
list costs idle seconds at the end, never a test. Longest first as measured on a 2-core Xeon (2026-11-27).
"""
from __future__ import annotations

LONGEST_FIRST = (
    "notebooks/04_torch_compile.ipynb", "notebooks/12_fid_clip.ipynb", "notebooks/10_ladder.ipynb",
    "notebooks/11_training_scaling.ipynb", "tests/test_reference_train.py", "notebooks/07_engine_export.ipynb",
    "tests/test_nncf_alternatives.py", "tests/test_reference_techniques.py", "tests/test_runner.py",
    "notebooks/13_serving.ipynb", "notebooks/08_quantization.ipynb", "tests/test_opt_engine_export.py",
    "tests/test_nncf_hybrid.py", "tests/test_training_ddp.py", "tests/test_opt_torch_compile.py",
    "tests/test_stage_engines.py", "tests/test_reference_model.py",
    # the rest of the notebooks (17-40 s each), so the last to start is the shortest
    "notebooks/09_fewer_steps.ipynb", "notebooks/00_baseline.ipynb", "notebooks/03_attention.ipynb",
    "notebooks/02_inference_mode.ipynb", "notebooks/01_half_precision.ipynb", "notebooks/06_deepspeed.ipynb",
    "notebooks/05_cuda_graphs.ipynb",
)


def _rank(nodeid: str) -> tuple[int, int]:
    scope = nodeid.split("::", 1)[0]
    if scope in LONGEST_FIRST:
        return 0, LONGEST_FIRST.index(scope)
    return (1 if scope.endswith(".ipynb") else 2), 0


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: a scope's own items keep their order
