"""sdperf.report.report_check in a real headless Chromium: a synthetic page with one problem of each kind beside clean
elements, and the report's own table markup; plus the no-browser path, which needs no browser."""
from __future__ import annotations

import pandas as pd
import pytest

from sdperf import cli
from sdperf.report import report, report_check

try:
    BROWSER = report_check.find_chromium()
except report_check.BrowserMissing:
    BROWSER = None
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (as root: apt-get install -y "
                                   "chromium); the report check needs a browser")

WIDE = "<div style='width: 2400px'>wide</div>"


def _figure(src: str, caption: str | None, extra: str = "") -> str:
    cap = "" if caption is None else f"<figcaption{extra}>{caption}</figcaption>"
    return f"<figure><img src='figures/{src}' alt='plot'>{cap}</figure>"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Each problem the check must find once, and the clean counterpart of each, which it must not flag."""
    folder = tmp_path_factory.mktemp("page")
    (folder / "figures").mkdir()
    from PIL import Image

    for name in ("clean.png", "bare.png", "name_only.png", "placeholder.png", "lazy.png"):
        Image.new("RGB", (40, 30), "steelblue").save(folder / "figures" / name)
    body = [
        "<h2 id='figures'>figures</h2>",
        _figure("clean.png", "Speed-up per image on this CPU over fp32 eager, median of 3 rounds · "
                             "<a href='figures/clean.svg'>SVG</a>"),
        _figure("absent.png", "A figure whose file was never written, over fp32 eager"),
        _figure("bare.png", None),
        _figure("name_only.png", "name_only.png · <a href='figures/name_only.svg'>SVG</a>"),
        _figure("placeholder.png", "No caption recorded: rerun the notebook", " class='missing'"),
        "<h2 id='tables'>tables</h2>",
        "<table id='narrow'><tr><td>fits</td></tr></table>",
        f"<div style='overflow-x: auto'><table id='scrolls'><tr><td>{WIDE}</td></tr></table></div>",
        f"<details><summary>rows</summary><table id='overflows'><tr><td>{WIDE}</td></tr></table></details>",
        "<div style='height: 4000px'></div><h2 id='below'>below the first screen</h2>",
        _figure("lazy.png", "Loaded only when scrolled to, on this CPU").replace("<img ", "<img loading='lazy' "),
    ]
    page = folder / "index.html"
    page.write_text(f"<!DOCTYPE html><html><head><style>{report.CSS}</style></head><body>{''.join(body)}</body></html>")
    return report_check.check_page(page, folder / "shot.png")


@needs_browser
def test_finds_exactly_the_planted_problems(synthetic):
    found = sorted((p.kind, p.where.split(" ")[0]) for p in synthetic.problems)
    assert found == [("figure", "'bare.png'"), ("figure", "'name_only.png'"), ("figure", "'placeholder.png'"),
                     ("image", "'absent.png'"), ("image", "'lazy.png'"), ("page", "document"),
                     ("table", "#overflows")]
    assert not synthetic.ok
    assert synthetic.counts["tables scrolling in a container"] == 1  # #scrolls: wide, but not the page's problem


@needs_browser
def test_says_why_each_problem_is_one(synthetic):
    by_where = {p.where.split(" ")[0]: p.detail for p in synthetic.problems}
    assert "does not load" in by_where["'absent.png'"]
    assert "loading=lazy" in by_where["'lazy.png'"] and "the file itself loads" in by_where["'lazy.png'"]
    assert "no <figcaption>" in by_where["'bare.png'"]
    assert "only repeats the file name" in by_where["'name_only.png'"]
    assert "marked missing" in by_where["'placeholder.png'"]
    assert "in tables" in [p.where for p in synthetic.problems if p.kind == "table"][0]  # named by its section
    page_problem = next(p.detail for p in synthetic.problems if p.kind == "page")
    assert "scrolls horizontally" in page_problem and "#overflows" in page_problem


@needs_browser
def test_writes_a_screenshot_of_the_page(synthetic):
    head = synthetic.screenshot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(head[16:20], "big") == report_check.WIDTH  # the PNG's width: the fixed viewport


@needs_browser
def test_report_tables_never_widen_the_page(tmp_path):
    """The report's own markup and CSS: many columns and a 90-character path in a note stay within the page."""
    path = "/work/main/.venv/lib/python3.11/site-packages/diffusers/utils/" + "x" * 40 + ".py"
    df = pd.DataFrame({f"column {i}": [f"value {i}", path if i == 8 else "float32"] for i in range(14)})
    classes = pd.DataFrame("", index=df.index, columns=df.columns)
    body = [report._styled_table(df, classes, "wide"), report._kv_table({"cache": path * 2})]
    page = tmp_path / "index.html"
    page.write_text(report._page("tables", body))
    result = report_check.check_page(page, tmp_path / "shot.png")
    assert result.problems == []
    assert result.counts["tables"] == 2


def _findings_page(tmp_path, before_px: int):
    items = "".join(f"<li>notebook {i}: one short sentence with its number</li>" for i in range(14))
    body = [f"<h2 id='headline'>The answer</h2><p style='height: {before_px}px'>answer</p>",
            f"<h2 id='findings'>What each notebook found</h2><ul class='findings'>{items}</ul>",
            "<div style='height: 3000px'>the rest of the page</div>"]
    page = tmp_path / f"findings-{before_px}.html"
    page.write_text(report._page("findings", body))
    return report_check.check_page(page, tmp_path / f"shot-{before_px}.png")


@needs_browser
def test_the_answer_and_findings_must_end_within_two_screens(tmp_path):
    """Measured on the page as first opened: 14 findings after a short answer fit; after a 1500 px answer they end
    past 2 x 800 px and the check names where they end."""
    short = _findings_page(tmp_path, 200)
    assert short.problems == [] and 0 < short.counts["px to the findings' end"] <= 1600
    long = _findings_page(tmp_path, 1500)
    (problem,) = long.problems
    end = long.counts["px to the findings' end"]
    assert problem.where == "ul.findings" and end > 1600 and f"end at {end} px" in problem.detail


@pytest.mark.parametrize("how", ["named binary missing", "none on PATH"])
def test_without_a_browser_it_says_how_to_install_and_exits_3(how, tmp_path, monkeypatch, capsys):
    reports = tmp_path / "reports"
    (reports / "smoke").mkdir(parents=True)
    (reports / "smoke" / "index.html").write_text("<html></html>")
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(reports))
    if how == "named binary missing":
        monkeypatch.setenv(report_check.CHROMIUM_ENV, str(tmp_path / "no-such-chrome"))
    else:
        monkeypatch.delenv(report_check.CHROMIUM_ENV, raising=False)
        monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["check-report", "--profile", "smoke"]) == report_check.EXIT_NO_BROWSER == 3
    err = capsys.readouterr().err
    assert "apt-get install -y chromium" in err


def test_a_profile_without_a_report_names_the_command_that_writes_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path))
    assert cli.main(["check-report", "--profile", "smoke"]) == 2
    assert "sdperf report --profile smoke" in capsys.readouterr().err
