"""The library's import contract, read from its source (issue 34): imports point down the layers, nothing forms a
circle, no library code reaches into a notebook's module, and neither the report nor a store imports the runner.

The graph is built with `ast` from every `import` in lib/sdperf, at module level and inside functions alike: an
import moved into a function to dodge a circle still counts as an edge, so the circle still fails here.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib" / "sdperf"

# Top to bottom: a module may import its own layer and any layer below it, never one above. Each layer's
# __init__ docstring says the same in words.
LAYERS = ["cli", "tooling", "experiments", "run", "report", "select", "measure", "model", "config", "store", "core"]
# Packages of one subject that cut across the layers (a technique's availability and its notebook's figures live
# together); the rules below still bind them: no experiments, no run, and no circles.
SUBJECTS = ["optimizations", "quality", "refmodel", "judge", "training", "serving", "imagegen"]
# Code that stores or reads back what a run wrote: it must not depend on how the run is driven.
STORES = ["sdperf.store", "sdperf.report", "sdperf.imagegen.store", "sdperf.refmodel.storage"]


def module_name(path: Path, root: Path = LIB) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = LIB) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _target(name: str, known: dict[str, Path]) -> str | None:
    """The sdperf module an imported name lands in: the longest known prefix (`from sdperf.x import f` is x)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(path: Path, known: dict[str, Path], root: Path = LIB) -> list[tuple[str, int, bool]]:
    """(imported sdperf module, line, at module level) for every import statement of the file, wherever it is."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` / `try:` blocks at module level are module level too
        if isinstance(node, (ast.If, ast.Try)):
            top |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            target = _target(name, known) if name.split(".")[0] == "sdperf" else None
            if target and target != me:
                found.append((target, node.lineno, id(node) in top))
    return found


def graph(root: Path = LIB) -> dict[str, list[tuple[str, int, bool]]]:
    known = modules(root)
    return {name: imports(path, known, root) for name, path in known.items()}


def edges(g: dict) -> list[tuple[str, str, str]]:
    """(importer, imported, 'path:line') for every import, function-level ones included."""
    return [(src, dst, f"{src.replace('.', '/')}.py:{line}") for src, outs in g.items() for dst, line, _ in outs]


def cycles(g: dict, module_level_only: bool = False) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a closed path through it."""
    adj = {m: sorted({d for d, _, top in outs if top or not module_level_only}) for m, outs in g.items()}
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(_closed_path(sorted(group), adj))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return found


def _closed_path(group: list[str], adj: dict) -> list[str]:
    """A readable circle through the group's first member: a -> b -> ... -> a (breadth-first, shortest)."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in adj[v]:
            if w == start:
                return paths[v] + [start]
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return group


def layer(module: str) -> str | None:
    """The role layer a module belongs to (`sdperf.measure.rounds` -> 'measure'), or None for a subject package
    and the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def upward(g: dict) -> list[str]:
    bad = []
    for src, dst, where in edges(g):
        a, b = layer(src), layer(dst)
        if a and b and LAYERS.index(b) < LAYERS.index(a):
            bad.append(f"{where}: {src} ({a}) imports {dst} ({b}), a layer above it")
    return bad


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def forbidden(g: dict) -> list[str]:
    bad = []
    for src, dst, where in edges(g):
        if _under(dst, "sdperf.experiments") and not _under(src, "sdperf.experiments"):
            bad.append(f"{where}: {src} imports the notebook module {dst}; only notebooks import experiments/")
        if _under(dst, "sdperf.run") and not (_under(src, "sdperf.run") or src == "sdperf.cli"):
            bad.append(f"{where}: {src} imports {dst}; only the command line drives a run")
        if any(_under(src, s) for s in STORES) and (_under(dst, "sdperf.run") or dst == "sdperf.cli"):
            bad.append(f"{where}: store/report code {src} imports run code {dst}")
        if _under(src, "sdperf.refmodel") and _under(dst, "sdperf.judge"):
            bad.append(f"{where}: the reference model {src} imports its judge {dst}")
    return bad


def test_every_module_is_in_a_layer_or_a_subject_package():
    loose = [m for m in modules() if m not in ("sdperf", "sdperf.cli") and layer(m) is None
             and m.split(".")[1] not in SUBJECTS + ["data"]]
    assert not loose, f"modules in no layer (put each in one of {LAYERS} or a subject package): {loose}"


def test_no_import_circles():
    found = cycles(graph())
    assert not found, "import circles (function-level imports count):\n" + "\n".join(" -> ".join(c) for c in found)


def test_layers_point_down():
    bad = upward(graph())
    assert not bad, "imports that point up the layers " + " > ".join(LAYERS) + ":\n" + "\n".join(bad)


def test_experiments_run_and_stores_are_imported_only_from_above():
    bad = forbidden(graph())
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------- the checks can fail

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "sdperf"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
    return root


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    root = _tree(tmp_path, {"measure/a.py": "from sdperf.measure import b\n",
                            "measure/b.py": "def f():\n    from sdperf.measure.a import x\n"})
    g = graph(root)
    assert cycles(g) == [["sdperf.measure.a", "sdperf.measure.b", "sdperf.measure.a"]]
    assert cycles(g, module_level_only=True) == []


def test_an_upward_import_is_named_with_its_line(tmp_path):
    root = _tree(tmp_path, {"store/results.py": "import os\n\n\ndef f():\n    from sdperf.report import report\n",
                            "report/report.py": "from sdperf.store.results import f\n"})
    assert upward(graph(root)) == ["sdperf/store/results.py:5: sdperf.store.results (store) imports "
                                   "sdperf.report.report (report), a layer above it"]


def test_library_code_importing_an_experiment_or_the_runner_is_named(tmp_path):
    root = _tree(tmp_path, {"experiments/ladder.py": "", "run/runner.py": "",
                            "refmodel/storage.py": "from sdperf.run import runner\n", "judge/paired.py": "",
                            "refmodel/sdref.py": "from sdperf.judge import paired\n",
                            "quality/rungs.py": "import sdperf.experiments.ladder\n"})
    bad = forbidden(graph(root))
    assert "sdperf/quality/rungs.py:1: sdperf.quality.rungs imports the notebook module " \
           "sdperf.experiments.ladder; only notebooks import experiments/" in bad
    assert "sdperf/refmodel/storage.py:1: store/report code sdperf.refmodel.storage imports run code " \
           "sdperf.run.runner" in bad
    assert "sdperf/refmodel/sdref.py:1: the reference model sdperf.refmodel.sdref imports its judge " \
           "sdperf.judge.paired" in bad


def test_every_notebook_calls_its_own_module_in_experiments():
    """One home per notebook's glue: each notebook imports a module of sdperf.experiments, the place that passes
    state between the library's parts, so no notebook does that itself."""
    import nbformat

    missing = []
    for path in sorted((LIB.parents[1] / "notebooks").glob("*.ipynb")):
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        if "from sdperf.experiments" not in code:
            missing.append(path.stem)
    assert not missing, f"notebooks without a module in lib/sdperf/experiments: {missing}"


@pytest.mark.parametrize("package", LAYERS[1:] + SUBJECTS)
def test_every_package_says_what_it_holds_and_may_import(package):
    doc = ast.get_docstring(ast.parse((LIB / package / "__init__.py").read_text())) or ""
    assert doc, f"sdperf/{package}/__init__.py has no docstring"
    if package in LAYERS:
        assert "May import:" in doc, f"sdperf/{package}/__init__.py does not say what it may import"
    listed = set(re.findall(r"\w+", doc))
    missing = sorted(p.stem for p in (LIB / package).glob("*.py") if p.stem != "__init__" and p.stem not in listed)
    assert not missing, f"sdperf/{package}/__init__.py does not name its modules {missing}"


def test_the_readme_layout_lists_every_subpackage():
    readme = (LIB.parents[1] / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.index("\n## ", 1)]
    listed = set(re.findall(r"^\| `lib/sdperf/(\w+)/` \|", layout, re.M))
    packages = {p.parent.name for p in LIB.glob("*/__init__.py")}
    assert packages - listed == set(), f"README's layout table lacks {sorted(packages - listed)}"
    assert listed - packages == set(), f"README's layout table names folders that are gone: {sorted(listed - packages)}"
