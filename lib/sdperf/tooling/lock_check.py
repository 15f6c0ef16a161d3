"""Does every pin of a lock have a wheel a Linux x86_64 CPython 3.11 machine can install? Asked of the indexes'
Simple API (PEP 691 JSON, else PEP 503 HTML), not by installing. A pin without one fails unless its line says
`sdist-ok: <why>` and a source release exists; one only an unreachable index could hold is unverified, not missing.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Callable
from urllib.parse import urldefrag, urljoin, urlsplit

from packaging import tags
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from sdperf.tooling.locks import Lock, Pin

PYTHON = (3, 11)
GLIBC = (2, 28)  # torch 2.14.1's wheel (the main lock) is manylinux_2_28: a machine that runs the study has this
ARCH = "x86_64"
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.01"
TIMEOUT_S = 60
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}

Fetch = Callable[[str], tuple[str, bytes]]  # url -> (content type, body); raises IndexUnreachable or ProjectMissing


class IndexUnreachable(Exception):
    """The index did not answer (DNS, TLS, timeout, 5xx): nothing can be said about the pin from it."""


class ProjectMissing(Exception):
    """The index answered 404: it has no such project."""


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None
    yanked: bool = False


@dataclass(frozen=True)
class PinResult:
    pin: Pin
    ok: bool
    detail: str
    file: IndexFile | None = None
    index: str | None = None
    unverified: bool = False  # failed, but an index that could hold the wheel did not answer


def supported_tags(python: tuple[int, int] = PYTHON, glibc: tuple[int, int] = GLIBC, arch: str = ARCH) -> list:
    """Tags pip accepts on that interpreter and platform, most preferred first (packaging.tags' own order)."""
    major, minor = glibc
    platforms = []
    for m in range(minor, 4, -1):
        platforms.append(f"manylinux_{major}_{m}_{arch}")
        if m in LEGACY_MANYLINUX:
            platforms.append(f"{LEGACY_MANYLINUX[m]}_{arch}")
    interpreter = f"cp{python[0]}{python[1]}"
    return [*tags.cpython_tags(python, platforms=platforms),
            *tags.compatible_tags(python, interpreter=interpreter, platforms=platforms)]


def fetch(url: str) -> tuple[str, bytes]:
    """GET a Simple API page, asking for JSON first; 404 means the index has no such project."""
    request = urllib.request.Request(url, headers={"Accept": ACCEPT, "User-Agent": "sdperf-lock-check"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise ProjectMissing(f"{url} answered 404") from None
        raise IndexUnreachable(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise IndexUnreachable(f"{urlsplit(url).netloc} could not be reached ({reason})") from None


class _Links(HTMLParser):
    """The anchors of a PEP 503 page: (href, text, yanked)."""

    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str, bool]] = []
        self._open: tuple[str, bool] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            attrs = dict(attrs)
            self._open = (attrs.get("href") or "", "data-yanked" in attrs)

    def handle_data(self, data):
        if self._open is not None:
            href, yanked = self._open
            self.links.append((href, data.strip(), yanked))
            self._open = None


def parse_files(content_type: str, body: bytes, page_url: str) -> list[IndexFile]:
    """The files a project page lists, from either form of the Simple API."""
    if "json" in content_type:
        data = json.loads(body)
        return [IndexFile(f["filename"], urljoin(page_url, f["url"]), f.get("hashes", {}).get("sha256"), f.get("size"),
                          bool(f.get("yanked"))) for f in data.get("files", [])]
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    files = []
    for href, text, yanked in parser.links:
        url, fragment = urldefrag(urljoin(page_url, href))
        name = text or url.rsplit("/", 1)[-1]
        sha = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else None
        files.append(IndexFile(name, url, sha, None, yanked))
    return files


def _release(filename: str) -> tuple[str, str, Version, frozenset] | None:
    """(kind, project, version, tags) of a wheel or sdist file name; None for anything else (eggs, .exe, ...)."""
    try:
        if filename.endswith(".whl"):
            name, version, _, wheel_tags = parse_wheel_filename(filename)
            return "wheel", name, version, wheel_tags
        name, version = parse_sdist_filename(filename)
        return "sdist", name, version, frozenset()
    except (InvalidWheelFilename, InvalidSdistFilename, ValueError):
        return None


def _best_wheel(pin: Pin, files: list[IndexFile], ranked: dict) -> tuple[IndexFile | None, list[str], list]:
    """(the wheel pip would prefer, every file of the pinned release, its sdists)."""
    version = Version(pin.version)
    release, sdists, best, best_rank = [], [], None, None
    for f in files:
        parsed = _release(f.filename)
        if parsed is None or parsed[1] != pin.key or parsed[2] != version:
            continue
        kind, _, _, wheel_tags = parsed
        release.append(f.filename)
        if kind == "sdist":
            sdists.append(f)
            continue
        rank = min((ranked[t] for t in wheel_tags if t in ranked), default=None)
        if rank is not None and (best is None or (f.yanked, rank) < (best.yanked, best_rank)):
            best, best_rank = f, rank
    return best, release, sdists


def _describe(f: IndexFile) -> str:
    size = ("size not given by the index" if f.size is None
            else f"{f.size / 1e6:,.1f} MB" if f.size >= 1e6 else f"{f.size / 1e3:,.1f} kB")
    sha = f"sha256 {f.sha256}" if f.sha256 else "no sha256 given by the index"
    return f"{f.filename}  {size}  {sha}" + ("  (yanked)" if f.yanked else "")


def check_pin(pin: Pin, index_urls, ranked: dict, get: Fetch, target: str) -> PinResult:
    """The first index (in the lock's order) with a compatible wheel wins; otherwise say what each index holds."""
    notes, sdist, unreachable = [], None, False
    for index in index_urls:
        host = urlsplit(index).netloc
        url = f"{index}{pin.key}/"
        try:
            content_type, body = get(url)
        except ProjectMissing:
            notes.append(f"{host}: no project {pin.key}")
            continue
        except IndexUnreachable as exc:
            notes.append(f"{host}: unreachable from here, unverified ({exc})")
            unreachable = True
            continue
        try:
            files = parse_files(content_type, body, url)
        except ValueError as exc:  # JSON that does not parse, a page that is not an index page
            notes.append(f"{host}: unreadable answer for {pin.key} ({exc})")
            continue
        best, release, sdists = _best_wheel(pin, files, ranked)
        if best is not None:
            return PinResult(pin, True, _describe(best), best, host)
        if not release:
            notes.append(f"{host}: no files for {pin.version}")
        else:
            shown = ", ".join(release[:4]) + (f" and {len(release) - 4} more" if len(release) > 4 else "")
            notes.append(f"{host}: no {target} wheel among {shown}")
        if sdists and sdist is None:
            sdist = (host, sdists[0])
    if pin.sdist_ok and sdist:
        host, f = sdist
        return PinResult(pin, True, f"{_describe(f)}  (source only, built at install: {pin.sdist_ok})", f, host)
    return PinResult(pin, False, "; ".join(notes) or "no index to ask", unverified=unreachable)


def check_lock(lock: Lock, get: Fetch | None = None, python=PYTHON, glibc=GLIBC, arch=ARCH) -> list[PinResult]:
    """One result per pin, in the lock's order; each index page is fetched once (by `fetch` unless `get` is given)."""
    get = get or fetch
    ranked = {t: i for i, t in reversed(list(enumerate(supported_tags(python, glibc, arch))))}
    pages: dict[str, tuple[str, bytes] | Exception] = {}

    def cached(url: str) -> tuple[str, bytes]:
        if url not in pages:
            try:
                pages[url] = get(url)
            except (IndexUnreachable, ProjectMissing) as exc:
                pages[url] = exc
        if isinstance(pages[url], Exception):
            raise pages[url]
        return pages[url]

    target = describe_target(python, glibc, arch)
    pins = sorted(lock.pins.values(), key=lambda p: p.line)
    return [check_pin(pin, lock.index_urls, ranked, cached, target) for pin in pins]


def describe_target(python=PYTHON, glibc=GLIBC, arch=ARCH) -> str:
    return f"CPython {python[0]}.{python[1]} manylinux_{glibc[0]}_{glibc[1]}_{arch}"


def summary(lock: Lock, results: list[PinResult], python=PYTHON, glibc=GLIBC, arch=ARCH) -> str:
    """What a person reads: one line per pin, then the failures named."""
    lines = [f"{lock.path.name}: {len(results)} pins for {describe_target(python, glibc, arch)} "
             f"(or an older manylinux / pure-Python wheel); indexes: {', '.join(lock.index_urls)}"]
    for r in results:
        where = f" [{r.index}]" if r.index else ""
        lines.append(f"{'ok    ' if r.ok else 'FAILED'}  {r.pin}{where}  {r.detail}")
    failed = [str(r.pin) + (" (unverified: an index did not answer)" if r.unverified else "")
              for r in results if not r.ok]
    lines.append(f"{len(results) - len(failed)} of {len(results)} pins have an installable file"
                 + (f"; no wheel shown for: {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)


def exit_code(results: list[PinResult]) -> int:
    """0: every pin has a file; 1: some pin has none on any index that answered; 3: only unverified gaps."""
    failed = [r for r in results if not r.ok]
    if any(not r.unverified for r in failed):
        return 1
    return 3 if failed else 0
