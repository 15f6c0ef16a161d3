"""Rules the notebooks keep: no outputs but those of cells marked `# NBVAL_CHECK_OUTPUT`. `python -m
sdperf.tooling.notebook_hygiene refresh` stores exactly those (run on smoke); `check` lists violations.
"""
from __future__ import annotations

import ast
import sys
import tempfile
from pathlib import Path

CHECK = "# NBVAL_CHECK_OUTPUT"
IGNORE = "# NBVAL_IGNORE_OUTPUT"
_LITERALS = (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.UnaryOp)


def is_checked(cell) -> bool:
    return cell.cell_type == "code" and cell.source.lstrip().startswith(CHECK)


def parameters_cells(nb) -> list:
    return [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]


def _literal_only(source: str) -> list[str]:
    problems = []
    for node in ast.parse(source).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if value is None:
            problems.append(f"line {node.lineno}: only assignments belong in the parameters cell")
        elif not all(isinstance(n, _LITERALS + (ast.expr_context, ast.unaryop)) for n in ast.walk(value)):
            problems.append(f"line {node.lineno}: parameter values must be literals (derive in the next cell)")
    return problems


def check(path: Path) -> list[str]:
    """Violations of the notebook rules in one source notebook (empty when clean)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    out = []
    ks = nb.metadata.get("kernelspec", {})
    if ks.get("name") != "python3" or ks.get("language") != "python":
        out.append(f"kernelspec must be python3/python, got {ks}")
    params = parameters_cells(nb)
    if len(params) != 1:
        out.append(f"exactly one cell must carry the 'parameters' tag, found {len(params)}")
    else:
        out += [f"parameters cell {p}" for p in _literal_only(params[0].source)]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.outputs and not is_checked(cell):
            out.append(f"cell {i} has outputs but is not marked {CHECK}")
        if cell.get("execution_count") is not None and not cell.outputs:
            out.append(f"cell {i} has an execution count but no outputs")
        if "papermill" in cell.get("metadata", {}):
            out.append(f"cell {i} carries papermill metadata (an executed copy, not a source)")
    if "papermill" in nb.metadata:
        out.append("notebook carries papermill metadata (an executed copy, not a source)")
    return out


def strip(nb, reference=None):
    """Clear every output except checked cells, whose outputs come from `reference` (an executed copy)."""
    ref_by_id = {c.get("id"): c for c in reference.cells} if reference is not None else {}
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        ref = ref_by_id.get(cell.get("id"))
        if is_checked(cell) and ref is not None:
            count += 1
            cell.outputs = [o for o in ref.outputs if not (o.output_type == "stream" and o.name == "stderr")]
            cell.execution_count = count
        elif not is_checked(cell):
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("papermill", None)
    return nb


def refresh(path: Path, profile: str = "smoke") -> None:
    """Execute on `profile` into a scratch folder and keep only the checked cells' outputs."""
    import os

    import nbformat
    import papermill

    from sdperf.core.paths import REPO_ROOT
    from sdperf.store.results import atomic_write_text

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SDPERF_REPORTS_DIR"] = tmp
        executed = Path(tmp) / path.name
        papermill.execute_notebook(str(path), str(executed), parameters={"profile": profile},
                                   kernel_name="python3", cwd=str(REPO_ROOT), progress_bar=False)
        ref = nbformat.read(executed, as_version=4)
    nb = strip(nbformat.read(path, as_version=4), ref)
    atomic_write_text(path, nbformat.writes(nb) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("check", "refresh"):
        print("usage: python -m sdperf.tooling.notebook_hygiene {check|refresh} NOTEBOOK...", file=sys.stderr)
        return 2
    bad = 0
    for name in argv[1:]:
        path = Path(name)
        if argv[0] == "refresh":
            refresh(path)
        for problem in check(path):
            bad += 1
            print(f"{path}: {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
