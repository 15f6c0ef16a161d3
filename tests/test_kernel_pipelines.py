"""One pipeline of the model at a time (issue 32): no notebook holds a pipeline in its kernel while it launches
fresh-process workers that build their own. An SDXL kernel holding one (14.2 GB) was OOM-killed while its worker
built a second; the audit below reads the notebooks and the experiment modules, so a cell order that brings that
back fails here, before anything is run."""
from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
EXPERIMENTS = sorted((REPO / "lib" / "sdperf" / "experiments").glob("*.py"))
# what starts workers: comparison.run_variants and sdperf.measure.rounds' run/alone
SEEDS = {"run_variants"}
ROUNDS_CALLS = {"alone", "run"}


STEMS = {p.stem for p in EXPERIMENTS}


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Name -> experiments module it stands for: each module by its own name, and `from sdperf.experiments import
    serving as experiment` as written."""
    out = {stem: stem for stem in STEMS}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "sdperf.experiments":
            out.update({a.asname or a.name: a.name for a in node.names})
    return out


def _called(node: ast.AST, aliases: dict[str, str] | None = None) -> set[str]:
    """What a body calls: f(...) as 'f'; experiment.f(...) on an experiments module as '<module>.f'; rounds.run(...)
    as 'rounds.run'; another module's function only when it is a seed (comparison.run_variants): a same-named
    function elsewhere (loadgen_run.run) is not an experiment's."""
    aliases = _aliases(node) if aliases is None else aliases
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name):
                out.add(f.id)
            elif isinstance(f, ast.Attribute):
                recv = f.value.id if isinstance(f.value, ast.Name) else None
                if recv in aliases:
                    out.add(f"{aliases[recv]}.{f.attr}")
                elif recv == "rounds" and f.attr in ROUNDS_CALLS:
                    out.add("rounds." + f.attr)
                elif f.attr in SEEDS:
                    out.add(f.attr)
    return out


def launching_functions(sources: dict[str, str]) -> set[str]:
    """Functions of the experiment modules (stem -> source) that start workers, directly or through another such
    function (a fixed point over their call graph), each as '<module>.<name>' and as its bare name."""
    bodies, defined = {}, {}
    for stem, src in sources.items():
        tree = ast.parse(src)
        aliases = _aliases(tree)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                bodies[f"{stem}.{node.name}"] = _called(node, aliases)
                defined.setdefault(stem, set()).add(node.name)
    launching = set(SEEDS) | {"rounds.alone", "rounds.run"}
    changed = True
    while changed:
        changed = False
        names = {q.split(".", 1)[1] for q in launching if "." in q and q.split(".")[0] in sources}
        for qual, calls in bodies.items():
            stem = qual.split(".")[0]
            mine = {c for c in calls if "." not in c and c in defined.get(stem, ())}
            bare = {c for c in calls if "." not in c} - mine
            if qual not in launching and (calls & launching or {f"{stem}.{c}" for c in mine} & launching
                                          or bare & names):
                launching.add(qual)
                changed = True
    return launching | {q.split(".", 1)[1] for q in launching if q.split(".")[0] in sources}


def held_pipelines(cells: list[str], launching: set[str]) -> list[str]:
    """Each cell that launches workers while an earlier top-level cell's `X = study.pipeline(...)` still holds its
    pipeline (not dropped by `del X` or `X = None`)."""
    held, found, aliases = {}, [], {stem: stem for stem in STEMS}
    trees = {}
    for i, src in enumerate(cells):
        try:
            trees[i] = ast.parse(src)
        except SyntaxError:  # IPython magics: not Python, and none of them builds a pipeline
            continue
        aliases.update(_aliases(trees[i]))  # the notebook's imports, wherever its import cell is
    for i, tree in trees.items():
        calls = _called(tree, aliases) & launching
        if calls and held:
            found.append(f"cell {i} calls {', '.join(sorted(calls))} while {', '.join(sorted(held))} "
                         f"(built in cell {', '.join(str(c) for c in sorted(held.values()))}) holds a pipeline")
        for node in tree.body:
            if isinstance(node, ast.Delete):
                for t in node.targets:
                    held.pop(getattr(t, "id", None), None)
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                builds = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                             and n.func.attr == "pipeline" for n in ast.walk(node.value))
                for name in names:
                    if builds:
                        held[name] = i
                    else:
                        held.pop(name, None)
    return found


@pytest.fixture(scope="module")
def launching():
    return launching_functions({p.stem: p.read_text() for p in EXPERIMENTS})


def test_audit_knows_the_launchers(launching):
    assert {"measure_batches", "run_variants", "compare_precisions"} <= launching
    assert "parameter_table" not in launching and "roofline" not in launching


def test_audit_catches_a_pipeline_held_across_workers(launching):
    """The order of 00 before issue 32: the pipeline built, then the batch sweep's workers launched."""
    cells = ['pipe = study.pipeline("float32")', "runs = baseline.measure_batches(study)"]
    assert held_pipelines(cells, launching) == [
        "cell 1 calls baseline.measure_batches while pipe (built in cell 0) holds a pipeline"]
    assert held_pipelines(cells[:1] + ["del pipe"] + cells[1:], launching) == []
    assert held_pipelines(cells[::-1], launching) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_holds_a_pipeline_while_workers_run(path, launching):
    nb = nbformat.read(path, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    assert held_pipelines(cells, launching) == []
