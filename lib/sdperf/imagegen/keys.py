"""What one image is: its key (prompt id, guidance, seed), its file, and which rank makes it (decided by the keys
alone, so every rank of every launch agrees); latents come from a key's own seed."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from sdperf.core.errors import ConfigError, short
from sdperf.config.profiles import MAX_SEED

# Guidance 1 turns classifier-free guidance off; below 1 no protocol asks for. NeMo's FID-CLIP curve uses these.
MIN_GUIDANCE = 1.0
NEMO_GUIDANCE = (1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
_EXAMPLE = " ".join(f"{g:g}" for g in NEMO_GUIDANCE)
MAX_NAME_BYTES = 200  # file systems allow 255; the temp file adds a prefix and a suffix
_NAME = re.compile(r"^(?P<id>.+)_s(?P<seed>\d+)\.png$")


@dataclass(frozen=True, order=True)
class ImageKey:
    """One image to generate; sorted by guidance, then prompt id, then seed (the order work is split in)."""

    guidance: float
    prompt_id: str
    seed: int

    @property
    def name(self) -> str:
        """The key as one string (the manifest's `key` column): the image's path without its suffix."""
        return self.relpath.removesuffix(".png")

    @property
    def relpath(self) -> str:
        """Folder per guidance scale (what a per-scale FID reads), file per prompt id and seed."""
        return f"{guidance_dir(self.guidance)}/{_quote_id(self.prompt_id)}_s{self.seed}.png"


def guidance_dir(guidance: float) -> str:
    return f"g{float(guidance)!r}"


def _quote_id(prompt_id: str) -> str:
    """Any id as one safe file-name part; reversible, so two ids never share a file."""
    name = quote(prompt_id, safe="-_.")
    return "%2E" + name[1:] if name.startswith(".") else name  # no hidden files, no '.' or '..'


def check_guidance(values) -> tuple[float, ...]:
    """Sorted, de-duplicated guidance scales; a bad one fails naming it and what is valid."""
    values = list(values) if values is not None else []
    if not values:
        raise ConfigError(f"guidance: give at least one scale >= {MIN_GUIDANCE:g}, e.g. NeMo's {_EXAMPLE}")
    out = set()
    for v in values:
        try:
            g = float(v)
        except (TypeError, ValueError):
            g = math.nan
        if isinstance(v, bool) or not math.isfinite(g) or g < MIN_GUIDANCE:
            raise ConfigError(f"guidance {v!r} is not valid; choose finite numbers >= {MIN_GUIDANCE:g} "
                              f"({MIN_GUIDANCE:g} turns guidance off), e.g. {_EXAMPLE}")
        out.add(g)
    return tuple(sorted(out))


def check_seeds(values) -> tuple[int, ...]:
    """Integers from 0 to MAX_SEED (a larger one would overflow torch.Generator.manual_seed)."""
    values = list(values) if values is not None else []
    if not values:
        raise ConfigError("seeds: give at least one integer seed >= 0")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SEED:
            raise ConfigError(f"seed {short(v)} is not valid; choose integers from 0 to {MAX_SEED} (2**63-1)")
    return tuple(sorted(set(values)))


def plan_keys(prompt_ids, guidance_scales, seeds=None, base_seed: int = 0) -> list[ImageKey]:
    """Every (prompt id, guidance, seed) once, sorted; ids too long for a file name fail here, before any work.
    Without `seeds`, prompt i gets seed base_seed + i at every guidance scale; with `seeds`, every prompt gets each."""
    ids = list(dict.fromkeys(str(i) for i in prompt_ids))
    for pid in ids:
        if len(_quote_id(pid).encode()) > MAX_NAME_BYTES:
            raise ConfigError(f"prompt id {pid[:60]!r}... is too long to name a file (over {MAX_NAME_BYTES} bytes "
                              "once quoted); give shorter ids")
    check_seeds([base_seed])
    per_prompt = {pid: check_seeds(seeds if seeds is not None else (base_seed + i,)) for i, pid in enumerate(ids)}
    return sorted(ImageKey(g, pid, s) for g in check_guidance(guidance_scales) for pid in ids for s in per_prompt[pid])


def work_units(keys: list[ImageKey], batch_size: int) -> list[tuple[ImageKey, ...]]:
    """Batches of keys sharing a guidance scale, from all keys in order: the same (pixels too) at any world size."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch size {batch_size!r} is not valid; choose an integer >= 1")
    units: list[tuple[ImageKey, ...]] = []
    for key in sorted(keys):
        last = units[-1] if units else ()
        if last and len(last) < batch_size and last[0].guidance == key.guidance:
            units[-1] = last + (key,)
        else:
            units.append((key,))
    return units


def shard(units: list, rank: int, world_size: int) -> list:
    """Round robin over the sorted units: balanced to one unit, the same on every rank and every launch."""
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not valid for world size {world_size}; choose 0..{world_size - 1}")
    return units[rank::world_size]


def parse_relpath(relpath: str) -> ImageKey | None:
    """The key a file name stands for (None for anything that is not an image of this layout)."""
    folder, _, name = relpath.rpartition("/")
    m = _NAME.match(name)
    if not m or not folder.startswith("g"):
        return None
    try:
        return ImageKey(float(folder[1:]), unquote(m["id"]), int(m["seed"]))
    except ValueError:
        return None
