"""Packaging, CI wiring, notebook rules and the published figures' transcription."""
from __future__ import annotations

import re

import nbformat
import pytest
import yaml

from sdperf.config import published
from sdperf.tooling import notebook_hygiene
from sdperf.core.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


def lock() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_conda_environment_installs_the_same_lock():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    assert "python=3.11" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    assert "-r requirements.lock" in pip
    conda_pins = [d for d in deps if isinstance(d, str) and "=" in d and not d.startswith("python")]
    assert conda_pins == [], "pin packages in requirements.lock only, so pip and conda cannot disagree"


def test_lock_pins_every_dependency_exactly_and_agrees_with_pyproject():
    pins = lock()
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"
    assert pins["diffusers"].startswith("0.42.") and pins["transformers"].startswith("5.")
    assert pins["deepspeed"].startswith("0.19.")
    text = (REPO_ROOT / "pyproject.toml").read_text()
    for name, version in re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', text):
        assert pins[name.lower()] == version, f"pyproject pins {name}=={version}, lock has {pins[name.lower()]}"
    for name in re.findall(r'"([A-Za-z0-9_.-]+)[",=<>]', text.split("dependencies = [")[1].split("]")[0]):
        assert name.lower() in pins, f"{name} is a dependency but not in requirements.lock"


def test_readme_first_screen_gives_study_and_test_commands():
    first = (REPO_ROOT / "README.md").read_text().splitlines()[:12]
    assert any(line.startswith("make study") for line in first)
    assert any(line.startswith("make test") for line in first)
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text()
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "--nbval-lax" in makefile and "pytest tests" in makefile


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_follows_the_rules(path):
    assert notebook_hygiene.check(path) == []
    nb = nbformat.read(path, as_version=4)
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 4, "prose between the steps"
    assert any(notebook_hygiene.is_checked(c) for c in nb.cells)
    assert "profile" in notebook_hygiene.parameters_cells(nb)[0].source


def test_study_has_the_foundation_notebooks():
    assert {"00_baseline", "01_half_precision"} <= {p.stem for p in NOTEBOOKS}


def _nb(cells):
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def test_hygiene_check_catches_violations(tmp_path):
    params = nbformat.v4.new_code_cell("a = 3\ntwice = a * 2")
    params.metadata["tags"] = ["parameters"]
    noisy = nbformat.v4.new_code_cell("print(1)", outputs=[nbformat.v4.new_output("stream", text="1\n")])
    second = nbformat.v4.new_code_cell("b = 1")
    second.metadata["tags"] = ["parameters"]
    path = tmp_path / "bad.ipynb"
    nbformat.write(_nb([params, noisy]), path)
    problems = notebook_hygiene.check(path)
    assert any("literals" in p for p in problems) and any("not marked" in p for p in problems)
    nbformat.write(_nb([params, second]), path)
    assert any("exactly one cell" in p for p in notebook_hygiene.check(path))


def test_strip_keeps_only_checked_outputs():
    checked = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(1)")
    timing = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(2)")
    nb = _nb([checked, timing])
    ref = _nb([nbformat.v4.new_code_cell(c.source, outputs=[nbformat.v4.new_output("stream", text="x\n")])
               for c in nb.cells])
    for a, b in zip(ref.cells, nb.cells):
        a["id"] = b["id"]
    out = notebook_hygiene.strip(nb, ref)
    assert out.cells[0].outputs and out.cells[0].execution_count == 1
    assert out.cells[1].outputs == [] and out.cells[1].execution_count is None


def test_published_sources_are_cited_by_url():
    df = published.load()
    assert "source_file" not in df and df.url.str.match(r"https?://").all()
    assert published.cite("Paiton SDXL").endswith("(https://www.evp.cloud/post/advanced-optimization-in-image-"
                                                  "generation-soaring-from-5-it-s-to-11-it-s)")
    with pytest.raises(KeyError, match="valid sources: Cerebrium SD ladder"):
        published.url("Cerebrium")
