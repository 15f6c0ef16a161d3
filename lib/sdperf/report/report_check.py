"""A browser check of reports/<profile>/index.html: what a reader sees, not what the HTML says.

Headless Chromium (via playwright) fails the page, listing every problem, when an <img> does not load, a table or the
document is wider than the page, a <figure> lacks a real caption, or the findings end below FIRST_SCREENS screens.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sdperf.core import paths
from sdperf.core.errors import ConfigError

WIDTH = 1280  # px: a common laptop screen; the page's max-width (72rem) fits inside it with its margins
HEIGHT = 900
SCREEN_HEIGHT = 800  # px: the 1280x800 window the first screens are judged in
FIRST_SCREENS = 2  # the answer and the findings sentences fit in this many screens of SCREEN_HEIGHT
MIN_CAPTION_WORDS = 3
LOAD_TIMEOUT_MS = 30_000
IMAGE_TIMEOUT_MS = 5_000
SHOT_MAX_HEIGHT = 60_000  # px of the screenshot; a taller page is cut there (and the cut is said)
EXIT_PROBLEMS = 1
EXIT_NO_BROWSER = 3  # distinct from 1 (problems found) and 2 (bad input), so CI can tell "not checked" apart
CHROMIUM_ENV = "SDPERF_CHROMIUM"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = ("install Debian's Chromium (as root: apt-get install -y chromium; Ubuntu: chromium-browser), or "
                f"point ${CHROMIUM_ENV} at a Chrome/Chromium binary")


class BrowserMissing(RuntimeError):
    """No Chromium (or no playwright) here: the check cannot run, which is not the same as the page failing it."""


@dataclass(frozen=True)
class Problem:
    kind: str   # image | table | page | figure
    where: str  # which element: an image's file name, a table's id and section
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.where}: {self.detail}"


@dataclass
class CheckResult:
    page: Path
    problems: list[Problem]
    screenshot: Path | None
    counts: dict = field(default_factory=dict)  # images, tables, figures, scrolling tables: what was looked at
    screenshot_note: str = ""  # where the screenshot was cut, if it was

    @property
    def ok(self) -> bool:
        return not self.problems


def find_chromium() -> str | None:
    """${SDPERF_CHROMIUM} when set (it must be an executable), else the first Chromium or Chrome on PATH."""
    chosen = os.environ.get(CHROMIUM_ENV)
    if chosen:
        path = shutil.which(chosen)
        if path is None:
            raise BrowserMissing(f"${CHROMIUM_ENV}={chosen!r} is not an executable; {INSTALL_HINT}")
        return path
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


# Runs in the page after every <details> is opened; each rule is stated once, here, in CSS px.
MEASURE_JS = """
(minWords) => {
  const pageWidth = document.documentElement.clientWidth;
  const sx = window.scrollX;
  const headings = [...document.querySelectorAll('h1, h2, h3')];
  const sectionOf = (el) => {
    let last = null;
    for (const h of headings) {
      if (h.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING) last = h; else break;
    }
    return last ? (last.id || last.textContent.trim()).slice(0, 60) : 'top of page';
  };
  const clippedRight = (el) => {  // the right edge the reader can see: clipped by any scrolling/clipping ancestor
    let right = el.getBoundingClientRect().right + sx;
    for (let a = el.parentElement; a && a !== document.body && a !== document.documentElement; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== 'visible') right = Math.min(right, a.getBoundingClientRect().right + sx);
    }
    return right;
  };
  const fileName = (src) => { try { return decodeURIComponent(new URL(src).pathname.split('/').pop()); }
                              catch (e) { return src; } };

  const images = [...document.images].map((img, i) => ({
    index: i, file: fileName(img.currentSrc || img.src), lazy: img.loading === 'lazy',
    loaded: img.complete && img.naturalWidth > 0, section: sectionOf(img)}));

  let scrolling = 0;
  const tables = [...document.querySelectorAll('table')].map((t, i) => {
    const right = clippedRight(t);
    if (t.getBoundingClientRect().right + sx > right + 0.5) scrolling += 1;
    return {index: i, id: t.id, section: sectionOf(t), right: Math.round(right),
            width: Math.round(t.getBoundingClientRect().width)};
  }).filter(t => t.right > pageWidth + 0.5);

  const figures = [...document.querySelectorAll('figure')].map((f, i) => {
    const img = f.querySelector('img');
    const file = img ? fileName(img.currentSrc || img.src) : '';
    const cap = f.querySelector('figcaption');
    if (!cap) return {index: i, file, section: sectionOf(f), caption: null, words: 0};
    if (cap.classList.contains('missing'))
      return {index: i, file, section: sectionOf(f), caption: cap.innerText.trim().slice(0, 80), words: 0,
              missing: true};
    let text = cap.innerText;
    for (const a of cap.querySelectorAll('a')) text = text.split(a.innerText).join(' ');
    const stem = file.replace(/\\.[^.]+$/, '');
    for (const s of [file, stem, img ? img.alt : ''].filter(Boolean)) text = text.split(s).join(' ');
    const words = (text.match(/[\\p{L}\\p{N}][\\p{L}\\p{N}'.,%-]*/gu) || []).length;
    return {index: i, file, section: sectionOf(f), caption: cap.innerText.trim().slice(0, 80), words};
  }).filter(f => f.caption === null || f.words < minWords);

  const doc = document.documentElement;
  const culprits = [];
  if (doc.scrollWidth > pageWidth) {
    for (const el of document.body.querySelectorAll('*')) {
      const parent = el.parentElement;
      if (clippedRight(el) > pageWidth + 0.5 &&
          (parent === document.body || clippedRight(parent) <= pageWidth + 0.5)) {
        culprits.push({tag: el.tagName.toLowerCase(), id: el.id, section: sectionOf(el),
                       right: Math.round(clippedRight(el))});
        if (culprits.length >= 5) break;
      }
    }
  }
  return {pageWidth, scrollWidth: doc.scrollWidth, height: doc.scrollHeight, images, tables, figures, culprits,
          counts: {images: document.images.length, tables: document.querySelectorAll('table').length,
                   figures: document.querySelectorAll('figure').length, 'tables scrolling in a container': scrolling}};
}
"""

# Waits (bounded) for every image the browser has started to fetch, so "not loaded" means "will not load".
SETTLE_JS = """
(timeoutMs) => Promise.all([...document.images].filter(i => !i.complete && i.loading !== 'lazy').map(i =>
  new Promise(done => { i.addEventListener('load', done); i.addEventListener('error', done);
                        setTimeout(done, timeoutMs); })))
"""

# Lazy images not loaded yet, made eager: "lazy, but the file is fine" vs "the file does not load".
EAGER_JS = """
async (timeoutMs) => {
  const waiting = [...document.images].filter(i => !(i.complete && i.naturalWidth > 0) && i.loading === 'lazy');
  await Promise.all(waiting.map(i => new Promise(done => {
    i.addEventListener('load', done); i.addEventListener('error', done); setTimeout(done, timeoutMs);
    i.loading = 'eager'; })));
  return [...document.images].map(i => i.complete && i.naturalWidth > 0);
}
"""


def check_page(page_path: Path, screenshot: Path | None = None, width: int = WIDTH) -> CheckResult:
    """Open one HTML file in headless Chromium and return every problem found (an empty list when it passes)."""
    page_path = Path(page_path).resolve()
    if not page_path.is_file():
        raise ConfigError(f"no page to check at {page_path}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 320:
        raise ConfigError(f"viewport width {width!r} is not valid; choose an integer of at least 320 px")
    executable = find_chromium()
    if executable is None:
        raise BrowserMissing(f"no Chromium found (looked for {', '.join(CHROMIUM_NAMES)} on PATH); {INSTALL_HINT}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise BrowserMissing("playwright is not installed in this environment (pinned in requirements.lock: "
                             f"make install, or pip install -r requirements.lock): {exc}") from None
    if screenshot is None:
        screenshot = Path(tempfile.mkdtemp(prefix="sdperf-check-report-")) / "page.png"
    screenshot = Path(screenshot)
    screenshot.parent.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=executable, headless=True)
        except Exception as exc:  # noqa: BLE001 - playwright's own Error: the program is not a working Chromium
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise BrowserMissing(f"{executable!r} did not start as a headless Chromium ({first}); set "
                                 f"${CHROMIUM_ENV} to a Chromium or Chrome, or unset it; {INSTALL_HINT}") from None
        try:
            page = browser.new_page(viewport={"width": width, "height": HEIGHT}, device_scale_factor=1)
            page.goto(page_path.as_uri(), wait_until="load", timeout=LOAD_TIMEOUT_MS)
            page.evaluate(SETTLE_JS, IMAGE_TIMEOUT_MS)
            shot_note = _screenshot(page, screenshot)
            first = page.evaluate(FIRST_SCREENS_JS)
            page.evaluate("() => document.querySelectorAll('details').forEach(d => { d.open = true; })")
            page.evaluate(SETTLE_JS, IMAGE_TIMEOUT_MS)
            seen = page.evaluate(MEASURE_JS, MIN_CAPTION_WORDS)
            loads_when_eager = page.evaluate(EAGER_JS, IMAGE_TIMEOUT_MS)
        finally:
            browser.close()
    problems = _problems(seen, loads_when_eager) + _first_screens(first)
    counts = dict(seen["counts"], **({"px to the findings' end": first} if first else {}))
    return CheckResult(page_path, problems, screenshot, counts, shot_note)


# Where the findings list, which follows the answer, ends on the page as first opened (document px; 0 if none).
FIRST_SCREENS_JS = """
() => { const el = document.querySelector('ul.findings');
        return el ? Math.round(el.getBoundingClientRect().bottom + window.scrollY) : 0; }
"""


def _first_screens(end_px: int) -> list[Problem]:
    """The answer and the findings must end within FIRST_SCREENS screens (a page without findings makes no claim)."""
    limit = FIRST_SCREENS * SCREEN_HEIGHT
    if end_px and end_px > limit:
        return [Problem("page", "ul.findings", f"the answer and the findings end at {end_px} px, past "
                                                f"{FIRST_SCREENS} screens of a {WIDTH}x{SCREEN_HEIGHT} window "
                                                f"({limit} px): shorten what comes before them or the sentences")]
    return []


def _screenshot(page, path: Path) -> str:
    """The page as a reader opens it (details closed, as all open is too tall to capture), to SHOT_MAX_HEIGHT px."""
    height = page.evaluate("document.documentElement.scrollHeight")
    clip = {"x": 0, "y": 0, "width": page.viewport_size["width"], "height": min(height, SHOT_MAX_HEIGHT)}
    page.screenshot(path=str(path), full_page=True, clip=clip, timeout=LOAD_TIMEOUT_MS)
    return f" (cut at {SHOT_MAX_HEIGHT} of {height} px)" if height > SHOT_MAX_HEIGHT else ""


def _problems(seen: dict, loads_when_eager: list[bool]) -> list[Problem]:
    out = []
    for img in seen["images"]:
        if img["loaded"]:
            continue
        where = f"{img['file']!r} (in {img['section']})"
        if img["lazy"] and loads_when_eager[img["index"]]:
            out.append(Problem("image", where, "not loaded when the page finished loading: it is loading=lazy, so "
                                               "a print or full-page capture shows it empty (the file itself loads)"))
        else:
            out.append(Problem("image", where, "does not load (missing or unreadable file)"))
    width = seen["pageWidth"]
    for t in seen["tables"]:
        name = f"#{t['id']}" if t["id"] else f"number {t['index'] + 1}"
        out.append(Problem("table", f"{name} (in {t['section']})",
                           f"right edge at {t['right']} px, past the {width} px page (table {t['width']} px wide); "
                           "wrap its cells or put it in a horizontally scrolling container"))
    if seen["scrollWidth"] > width:
        culprits = "; ".join(f"<{c['tag']}{' #' + c['id'] if c['id'] else ''}> in {c['section']} to {c['right']} px"
                             for c in seen["culprits"])
        out.append(Problem("page", "document", f"scrolls horizontally: {seen['scrollWidth']} px wide in a {width} px "
                                               f"viewport" + (f" (widest: {culprits})" if culprits else "")))
    for f in seen["figures"]:
        where = f"{f['file'] or 'without an image'!r} (in {f['section']})"
        if f["caption"] is None:
            out.append(Problem("figure", where, "has no <figcaption>"))
        elif f.get("missing"):
            out.append(Problem("figure", where, f"has no caption: its <figcaption> is marked missing "
                                                f"({f['caption']!r})"))
        else:
            out.append(Problem("figure", where, f"caption {f['caption']!r} only repeats the file name (fewer than "
                                                f"{MIN_CAPTION_WORDS} other words)"))
    return out


def check_report(profile: str, screenshot: Path | None = None, width: int = WIDTH) -> CheckResult:
    """reports/<profile>/index.html (under $SDPERF_REPORTS_DIR when set), as `sdperf report` last wrote it."""
    page = paths.profile_reports(profile) / "index.html"
    if not page.is_file():
        raise ConfigError(f"no report at {page}; write it first: sdperf report --profile {profile}")
    return check_page(page, screenshot, width)


def summary(result: CheckResult) -> str:
    seen = ", ".join(f"{n} {what}" for what, n in result.counts.items())
    lines = [str(p) for p in result.problems]
    verdict = f"FAILED: {len(result.problems)} problem(s)" if result.problems else "passed"
    lines.append(f"check-report {verdict} on {result.page} ({seen}); full-page screenshot: {result.screenshot}"
                 f"{result.screenshot_note}")
    return "\n".join(lines)
