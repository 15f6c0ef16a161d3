"""Adding a technique is one module and one profile line: everything else finds it through its catalog record.

The contract is checked on a copy of the library, params and notebooks with a dummy technique's module added to
sdperf/optimizations, its key to the smoke profile's list and its figure to the published table, nothing else: its notebook's comparison,
the stack search, the judging list, the memory estimate, the transfer statement, the environment's packages and the
published-vs-measured table must all name it. Every key the catalog declares says what each consumer needs.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sdperf.optimizations import catalog

ROOT = Path(__file__).resolve().parents[1]

DUMMY = '''"""A dummy technique for the add-a-technique contract (tests/test_add_a_technique.py)."""
from sdperf.optimizations.catalog import MERGING, Technique

NOTEBOOK = "03_attention"
TRANSFER = ("may not transfer", "a dummy that merges nothing")


def techniques() -> list[Technique]:
    return [Technique("dummy:half", "dummy merging", MERGING, NOTEBOOK, changes_output=True, loop_only=True,
                      transfer=TRANSFER, extra_copies={"unet": 1}, packages=("dummy-merge",))]
'''

CHECK = '''
import json
import pandas as pd
from sdperf.config.profiles import load_profile
from sdperf.report import published_vs_measured
from sdperf.core import environment
from sdperf.judge import transfer
from sdperf.measure import memory
from sdperf.optimizations import catalog
from sdperf.run import prefetch
from sdperf.select.stack_search import UNET_FAMILIES

prof = load_profile("smoke", check_runtime=False)
keys = prof.techniques
print(json.dumps({
    "modules": list(catalog.modules()),
    "compared": prefetch.keys_of("03_attention", prefetch.parameters("03_attention", prof), prof),
    "searched": catalog.among(keys, None, UNET_FAMILIES),
    "judged": catalog.among(keys, lossy=True),
    "extra_bytes": memory.formula(prof, "dummy:half", 1).parts["technique"],
    "transfer": list(transfer.statement("dummy:half")),
    "packages": sorted(environment.record("smoke", "cpu", catalog.packages())["packages"]),
    "published": published_vs_measured.table(pd.DataFrame()).claim.tolist(),
}))
'''


PUBLISHED = ('Dummy paper,https://example.org/dummy,,NVIDIA A10G,"SD 1.5, 512px, batch 1",dummy:half,dummy merging,'
             'speedup,1.5,x,1.5x,"a dummy figure",notebook=03_attention; key=dummy:half; batch=1; '
             'metric=seed_speedup_vs_fp32; what=dummy merging over fp32 eager\n')


def _copy_with_dummy(tmp_path: Path) -> Path:
    for part in ("lib", "params", "notebooks"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    (tmp_path / "lib" / "sdperf" / "optimizations" / "dummy_merge.py").write_text(DUMMY)
    with open(tmp_path / "lib" / "sdperf" / "data" / "published.csv", "a") as table:
        table.write(PUBLISHED)
    smoke = tmp_path / "params" / "smoke.yml"
    text = smoke.read_text()
    head, _, rest = text.partition("\ntechniques:")
    first, _, tail = rest.partition("\n")
    smoke.write_text(f"{head}\ntechniques:{first}\n  - \"dummy:half\"  # the contract's dummy\n{tail}")
    return tmp_path


def test_a_technique_added_as_one_module_and_one_profile_line_reaches_every_consumer(tmp_path):
    tree = _copy_with_dummy(tmp_path)
    env = {"PYTHONPATH": str(tree / "lib"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert "dummy_merge" in got["modules"]
    assert "dummy:half" in got["compared"]  # its notebook's comparison
    assert "dummy:half" in got["searched"] and "dummy:half" in got["judged"]
    assert got["extra_bytes"] > 0  # one more fp32 UNet in the memory estimate
    assert got["transfer"] == ["may not transfer", "a dummy that merges nothing"]
    assert "dummy-merge" in got["packages"]
    assert "dummy merging" in got["published"]  # its published row beside what the study measures


@pytest.mark.parametrize("key", catalog.keys())
def test_every_catalog_key_says_what_each_consumer_needs(key):
    """A lossy technique states whether its verdict transfers to SD 1.5 (the record refuses otherwise); every key
    says its memory rule (extra copies, empty: in place) and the packages it imports as typed fields; a UNet
    executor that quantizes says which kernel's roof bounds it."""
    t = catalog.get(key)
    assert t.transfer is not None or not t.changes_output
    assert isinstance(t.extra_copies, dict) and all(isinstance(v, int) and v > 0 for v in t.extra_copies.values())
    assert isinstance(t.packages, tuple)
    if key.startswith("int8:"):
        assert t.roof_kernel, f"{key} names no roof kernel"
