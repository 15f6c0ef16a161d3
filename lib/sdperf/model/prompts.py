"""Captions to generate images from: COCO 2014 validation captions from a file given by path, or the repo's own
smoke set. A malformed file fails with a ConfigError naming the path and what was expected.
"""
from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path

from sdperf.core.errors import ConfigError, short
from sdperf.core import tables

FORMATS = {
    ".json": "COCO annotations JSON (captions_val2014.json: {\"annotations\": [{\"id\", \"image_id\", \"caption\"}]})",
    ".tsv": "MLPerf captions TSV (captions_source.tsv: tab-separated with a header holding 'id' and 'caption')",
    ".txt": "plain text, one caption per line (id = 1-based line number)",
}
SMOKE_FILE = "captions_smoke.txt"
MAX_TOKENS = 77  # CLIP's context: 75 caption tokens plus start and end (StableDiffusionPipeline truncates there)


@dataclass(frozen=True)
class Caption:
    """One prompt and the id that names its images (annotation id, TSV id or line number) across shards and runs."""

    id: str
    text: str


def _accepted() -> str:
    return "; ".join(f"{suffix}: {what}" for suffix, what in FORMATS.items())


def _fail(path: Path, problem: str) -> ConfigError:
    return ConfigError(f"captions file {str(path)!r}: {problem}")


def load_captions(path, one_per_image: bool = True) -> list[Caption]:
    """All captions of a COCO JSON, MLPerf TSV or text file, in order; `one_per_image`: each image's lowest id."""
    path = Path(path).expanduser()
    if path.suffix.lower() not in FORMATS:
        raise _fail(path, f"unknown format {path.suffix or '(no suffix)'!r}; accepted formats: {_accepted()}")
    if path.is_dir():
        raise _fail(path, f"is a folder, not a file; expected a {FORMATS[path.suffix.lower()]}")
    if not path.is_file():
        raise _fail(path, f"does not exist; expected a {FORMATS[path.suffix.lower()]}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); expected a "
                          f"{FORMATS[path.suffix.lower()]}") from None
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror}); expected a {FORMATS[path.suffix.lower()]}") from None
    if not text.strip():
        raise _fail(path, f"is empty; expected a {FORMATS[path.suffix.lower()]}")
    reader = {".json": _from_coco_json, ".tsv": _from_tsv, ".txt": _from_text}[path.suffix.lower()]
    captions = reader(path, text, one_per_image) if reader is _from_coco_json else reader(path, text)
    if not captions:
        raise _fail(path, f"holds no captions; expected a {FORMATS[path.suffix.lower()]}")
    _check_unique(path, captions)
    return captions


def _from_coco_json(path: Path, text: str, one_per_image: bool) -> list[Caption]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(path, f"is not valid JSON ({exc}); expected a {FORMATS['.json']}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise _fail(path, f"has no 'annotations' list; expected a {FORMATS['.json']}")
    rows = data["annotations"]
    for i, ann in enumerate(rows):
        if not isinstance(ann, dict) or not {"id", "image_id", "caption"} <= set(ann):
            raise _fail(path, f"annotation {i} lacks one of 'id', 'image_id', 'caption': {str(ann)[:120]}")
    if one_per_image:
        first: dict = {}
        for ann in sorted(rows, key=lambda a: (str(a["image_id"]), _id_order(a["id"]))):
            first.setdefault(str(ann["image_id"]), ann)
        keep = {id(a) for a in first.values()}
        rows = [a for a in rows if id(a) in keep]
    return [Caption(str(a["id"]), _clean(a["caption"])) for a in rows]


def _id_order(value):
    return (0, int(value), "") if str(value).isdigit() else (1, 0, str(value))


def _from_tsv(path: Path, text: str) -> list[Caption]:
    reader = csv.DictReader(text.splitlines(), delimiter="\t")
    header = reader.fieldnames or []
    if "id" not in header or "caption" not in header:
        raise _fail(path, f"header {header!r} lacks an 'id' or 'caption' column; expected a {FORMATS['.tsv']}")
    out = []
    for line, row in enumerate(reader, start=2):
        if row.get("id") in (None, "") or row.get("caption") in (None, ""):
            raise _fail(path, f"line {line} has an empty id or caption; expected a {FORMATS['.tsv']}")
        out.append(Caption(str(row["id"]).strip(), _clean(row["caption"])))
    return out


def _from_text(path: Path, text: str) -> list[Caption]:
    """Blank lines are skipped; ids stay the line numbers, so an edited file keeps the ids of untouched lines."""
    return [Caption(str(n), _clean(line)) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _clean(caption) -> str:
    return " ".join(str(caption).split())


def _check_unique(path: Path, captions: list[Caption]) -> None:
    seen: set[str] = set()
    for c in captions:
        if c.id in seen:
            raise _fail(path, f"caption id {c.id!r} occurs more than once; ids name the generated images, "
                              "so each must be unique")
        seen.add(c.id)


def select(captions: list[Caption], n: int, seed: int) -> list[Caption]:
    """`n` captions drawn at random without replacement (NeMo's protocol); the same seed gives the same draw."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"caption selection: n must be an integer >= 1, got {n!r}")
    if n > len(captions):
        raise ConfigError(f"caption selection: asked for n={n} captions but the set holds only {len(captions)}; "
                          f"choose n <= {len(captions)} or give a larger captions file")
    return random.Random(seed).sample(list(captions), n)


def smoke_captions() -> list[Caption]:
    """The repo's own short COCO-style captions (written for this project), for smoke runs and tests."""
    with tables.file(SMOKE_FILE) as path:
        return load_captions(path)


def check_token_lengths(captions: dict[str, str]) -> None:
    """Every caption fits CLIP's 77 tokens (the pipeline cuts silently); only those over 75 bytes are tokenized."""
    long = [(cid, text) for cid, text in captions.items() if len(text.encode("utf-8")) > MAX_TOKENS - 2]
    if not long:
        return
    from sdperf.model.tokenizer import clip_tokenizer

    counts = clip_tokenizer()([text for _, text in long], verbose=False)["input_ids"]
    for (cid, text), ids in zip(long, counts):
        if len(ids) > MAX_TOKENS:
            raise ConfigError(f"caption {short(cid)} ({short(text, 120)}) is {len(ids)} CLIP tokens long with start "
                              f"and end, over the {MAX_TOKENS} the text encoder reads: the rest would be cut silently "
                              "(captions that differ only past the cut give identical images); shorten it")
