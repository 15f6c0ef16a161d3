"""The README a newcomer reads in five minutes states the committed answer, written from the committed report's
rows (sdperf.report.answer), and every docs/ page names modules that exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from sdperf.cli import main
from sdperf.report import answer
from sdperf.report.report import one_machine
from sdperf.store.results import read_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMITTED = ROOT / "reports" / "cpu" / "results.csv"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_LINES = 150


def committed_rows():
    return one_machine(read_table(COMMITTED))[0]


def test_the_readme_is_short_and_states_the_committed_answer():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    start, end = text.index(answer.BEGIN), text.index(answer.END) + len(answer.END)
    assert text[start:end] == answer.block(committed_rows()), (
        "README's answer is not the committed report's: run `sdperf answer --profile cpu --readme README.md`")
    table = answer.rows(committed_rows())
    assert [r["what"] for r in table[:2]] == ["best admissible stack", "best lossless stack"]
    assert all(re.match(r"\d+\.\d\dx \[\d+\.\d\d-\d+\.\d\d\]$", r["per image"]) for r in table)


def test_the_answer_follows_the_rows_it_is_written_from():
    rows = committed_rows()
    before = answer.rows(rows)[0]
    moved = rows.copy()
    at = (moved.notebook == answer.LADDER) & moved.scenario.str.startswith("best admissible stack: ") \
        & (moved.metric == answer.PER_IMAGE)
    assert at.sum() == 1
    moved.loc[at, ["value", "lo", "hi"]] = [3.0, 2.5, 3.5]
    after = answer.rows(moved)[0]
    assert before["per image"] != after["per image"] == "3.00x [2.50-3.50]"
    assert after["stack"] == before["stack"]


def test_sdperf_answer_rewrites_a_stale_block_and_refuses_a_file_without_one(tmp_path, monkeypatch, capsys):
    reports = tmp_path / "reports"
    (reports / "cpu").mkdir(parents=True)
    (reports / "cpu" / "results.csv").write_bytes(COMMITTED.read_bytes())
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(reports))
    stale = tmp_path / "README.md"
    stale.write_text(f"# title\n\n{answer.BEGIN}\n| old | table |\n{answer.END}\n\nafter\n")
    assert main(["answer", "--profile", "cpu", "--readme", str(stale)]) == 0
    text = stale.read_text()
    assert text.startswith("# title\n\n") and text.endswith("\n\nafter\n") and "| old |" not in text
    assert answer.block(committed_rows()) in text

    plain = tmp_path / "plain.md"
    plain.write_text("# no block here\n")
    assert main(["answer", "--profile", "cpu", "--readme", str(plain)]) == 2
    assert "no answer block" in capsys.readouterr().err
    assert plain.read_text() == "# no block here\n"


MODULE = re.compile(r"`(sdperf(?:\.\w+)+)`")


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_docs_page_names_the_modules_it_describes_and_they_exist(page):
    text = page.read_text()
    assert "What this page describes lives in" in text.split("\n\n", 2)[1]
    named = MODULE.findall(text)
    assert named, f"{page.name} names no module"
    lib = ROOT / "lib"
    for name in named:
        head = lib.joinpath(*name.split(".")[:3])  # the package and module; what follows may be a name in it
        assert head.with_suffix(".py").is_file() or (head / "__init__.py").is_file(), (
            f"{page.name} names {name}, which is not a module of lib/")
    listed = re.search(r"What this page describes lives in (.*?)\.\n\n", text, re.S).group(1)
    for package, members in re.findall(r"`(sdperf\.\w+)` \(([^)]*)\)", listed):
        for member in re.findall(r"`(\w+)`", members):
            assert (lib / package.replace(".", "/") / f"{member}.py").is_file(), f"{page.name}: {package}.{member}"


def test_every_link_of_the_readme_and_docs_reaches_a_file():
    for page in [README, *DOCS]:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"
