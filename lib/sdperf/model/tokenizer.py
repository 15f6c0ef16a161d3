"""The CLIP BPE tokenizer (SD 1.x, SD 2 and SDXL differ only in the padding token), built offline from
open-clip-torch's vocabulary file, with ids equal to the hub's."""
from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

from sdperf.core.paths import REPO_ROOT

_VOCAB_SIZE = 49408
_N_MERGES = _VOCAB_SIZE - 256 * 2 - 2


@functools.lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def bpe_file() -> Path:
    import open_clip.tokenizer as oct

    return Path(oct.default_bpe())


def _files(cache: Path) -> tuple[Path, Path]:
    """Write vocab.json and merges.txt once per cache folder (they are derived, never edited)."""
    vocab_path, merges_path = cache / "vocab.json", cache / "merges.txt"
    if vocab_path.is_file() and merges_path.is_file():
        return vocab_path, merges_path
    lines = gzip.open(bpe_file()).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1:1 + _N_MERGES]]
    symbols = list(_bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    assert len(tokens) == _VOCAB_SIZE, len(tokens)
    cache.mkdir(parents=True, exist_ok=True)
    from sdperf.store.results import atomic_write_text

    atomic_write_text(vocab_path, json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False))
    atomic_write_text(merges_path, "#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return vocab_path, merges_path


def clip_tokenizer(pad_token: str = "<|endoftext|>", cache: Path | None = None):
    """A transformers CLIPTokenizer equal to the hub's, with SD's 77-token context."""
    from transformers import CLIPTokenizer

    vocab, merges = _files(cache or REPO_ROOT / ".cache" / "clip-bpe")
    return CLIPTokenizer(vocab=str(vocab), merges=str(merges), pad_token=pad_token, model_max_length=77)
