"""The pinned locks (requirements.lock, requirements-gpu.lock) read as data, so they can be compared and checked.
A line is `name[extras]==version [# comment]` (`sdist-ok: <why>` allows a source-only release) or an index option.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from sdperf.core.errors import ConfigError

PYPI_SIMPLE = "https://pypi.org/simple/"
SDIST_OK = re.compile(r"sdist-ok:\s*(?P<why>.+)")
INDEX_OPTIONS = ("--index-url", "-i", "--extra-index-url")


@dataclass(frozen=True)
class Pin:
    """One `name==version` line: the name as written, canonicalized for comparison."""
    name: str
    version: str
    line: int
    extras: tuple[str, ...] = ()
    sdist_ok: str | None = None  # why a source-only release is acceptable, from the line's `sdist-ok:` comment

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)

    def __str__(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.name}{extras}=={self.version}"


@dataclass(frozen=True)
class Lock:
    path: Path
    pins: dict[str, Pin]  # by canonical name
    index_urls: tuple[str, ...] = field(default=(PYPI_SIMPLE,))  # in the order pip is told about them


def _split_comment(text: str) -> tuple[str, str]:
    """pip's rule: `#` at the start of a line or after whitespace starts a comment (a URL's `#fragment` does not)."""
    match = re.search(r"(^|\s)#", text)
    if not match:
        return text.strip(), ""
    return text[:match.start()].strip(), text[match.end():].strip()


def _pin(body: str, comment: str, number: int, path: Path) -> Pin:
    where = f"{path.name} line {number}"
    try:
        req = Requirement(body)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"{where}: {body!r} is not a requirement ({reason}); a lock line is name==version") from None
    specs = list(req.specifier)
    if req.url or req.marker or len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        raise ConfigError(f"{where}: {body!r} is not an exact pin; a lock pins every package as name==version "
                          "(no ranges, wildcards, URLs or markers)")
    ok = SDIST_OK.search(comment)
    return Pin(req.name, specs[0].version, number, tuple(sorted(req.extras)), ok.group("why").strip() if ok else None)


def read_lock(path: str | Path) -> Lock:
    """Parse a lock; a line that is neither a pin, an index option nor a comment fails, naming the line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"lock file {str(path)!r} does not exist; locks here: "
                          f"{', '.join(sorted(p.name for p in Path.cwd().glob('requirements*.lock'))) or 'none'}")
    pins: dict[str, Pin] = {}
    index_urls: list[str] = []
    replaced_default = False
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        body, comment = _split_comment(raw)
        if not body:
            continue
        if body.startswith("-"):
            option, value = re.match(r"(-[^\s=]*)[\s=]*(.*)", body).groups()
            if option not in INDEX_OPTIONS or not value:
                raise ConfigError(f"{path.name} line {number}: option {body!r} is not understood here; a lock may "
                                  f"hold pins and {', '.join(INDEX_OPTIONS)} URL")
            url = value.rstrip("/") + "/"
            if option == "--extra-index-url":
                index_urls.append(url)
            else:
                index_urls.insert(0, url)
                replaced_default = True
            continue
        pin = _pin(body, comment, number, path)
        if pin.key in pins:
            raise ConfigError(f"{path.name} line {number}: {pin.name} is pinned twice (also line {pins[pin.key].line})")
        pins[pin.key] = pin
    if not replaced_default:
        index_urls.insert(0, PYPI_SIMPLE)
    return Lock(path, pins, tuple(dict.fromkeys(index_urls)))


def disagreements(a: Lock, b: Lock) -> list[str]:
    """Every package both locks pin at different versions, one line each (the GPU lock installs over the main one)."""
    out = []
    for key in sorted(a.pins.keys() & b.pins.keys()):
        pa, pb = a.pins[key], b.pins[key]
        if Version(pa.version) != Version(pb.version):
            out.append(f"{pa.name}: {a.path.name} line {pa.line} pins {pa.version}, "
                       f"{b.path.name} line {pb.line} pins {pb.version}")
    return out
