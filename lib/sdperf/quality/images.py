"""Generated-image folders: one PNG per (caption, guidance, seed) and a manifest.csv naming them.

Images are stored as PNG (lossless): clean-fid showed that JPEG compression and the choice of resize filter each
move FID by whole points, so nothing lossy happens between the VAE and the scorer, and the one resize to the
scoring size happens in `load_for_scoring`, by a single documented method (PIL bicubic, which antialiases).
The folder layout (manifest columns key, prompt_id, caption, guidance, seed, file) is the one sharded generation
(`sdperf generate`, sdperf.imagegen) writes: the guidance-curve images are made by it, and any folder it made
scores the same way. The rung images need a technique applied to the pipeline and its grad mode, so they go
through `generate_with`, the study's own generation.generate per image.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from PIL import Image

from sdperf.errors import ConfigError
from sdperf.generation import Workload, generate
from sdperf.prompts import Caption
from sdperf.results import atomic_write_bytes, atomic_write_text

MANIFEST = "manifest.csv"
MANIFEST_COLUMNS = ["key", "prompt_id", "caption", "guidance", "seed", "file", "steps", "resolution", "seconds"]
REQUIRED = ("key", "prompt_id", "caption", "guidance", "seed", "file")
RESIZE = Image.Resampling.BICUBIC  # PIL's bicubic filter antialiases when shrinking (clean-fid's recommendation)


def safe_name(text: str) -> str:
    return re.sub(r"[^\w.-]", "_", str(text))


def image_key(prompt_id: str, guidance: float, seed: int) -> str:
    """A file-safe name that says which caption, guidance and noise made the image."""
    return f"p{safe_name(prompt_id)}_g{guidance:g}_s{seed}"


def plan(captions: list[Caption], guidance_scales, seed: int) -> list[dict]:
    """One row per image. Caption i gets noise seed `seed + i` at every guidance scale, so the curve compares
    guidance scales on the same noise (common random numbers: less variance between points of the curve)."""
    rows = []
    for g in guidance_scales:
        for i, c in enumerate(captions):
            s = seed + i
            key = image_key(c.id, float(g), s)
            rows.append({"key": key, "prompt_id": c.id, "caption": c.text, "guidance": float(g), "seed": s,
                         "file": f"{key}.png"})
    return rows


def to_png_bytes(image: torch.Tensor) -> bytes:
    """A [0, 1] CHW float image as 8-bit PNG bytes, converted and encoded as `sdperf generate` writes its images."""
    from sdperf.imagegen.render import to_uint8
    from sdperf.imagegen.store import png_bytes

    return png_bytes(to_uint8(image.clamp(0, 1)[None])[0])


def generate_with(pipe, rows: list[dict], out_dir: Path, *, steps: int, resolution: int,
                  grad_mode: str = "inference_mode", say: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Generate every planned image with `pipe` (batch 1, per-image seed), write PNGs and the manifest."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = []
    for i, row in enumerate(rows, start=1):
        wl = Workload(prompt=row["caption"], batch_size=1, steps=steps, guidance_scale=row["guidance"],
                      height=resolution, width=resolution, seed=row["seed"])
        start = time.perf_counter()
        out = generate(pipe, wl, grad_mode=grad_mode)
        seconds = time.perf_counter() - start  # wall time of this call (the first includes warm-up): no benchmark
        atomic_write_bytes(out_dir / row["file"], to_png_bytes(out.images[0]))
        done.append({**row, "steps": steps, "resolution": resolution, "seconds": seconds})
        if say and (i == len(rows) or i % max(1, len(rows) // 4) == 0):
            say(f"  {i}/{len(rows)} images in {out_dir.name}")
    manifest = pd.DataFrame(done, columns=MANIFEST_COLUMNS)
    atomic_write_text(out_dir / MANIFEST, manifest.to_csv(index=False))
    return manifest


def generate_images(study, captions: list[Caption], guidance_scales, out_dir: Path, *, steps: int,
                    dtype: str = "float32", say: Callable[[str], None] | None = None) -> pd.DataFrame:
    """The guidance-curve images: one per caption and guidance scale (caption i with seed profile.seed + i),
    through sdperf.imagegen.generate_folder, so the notebook's folder is the one `sdperf generate` would write
    (and a run sharded over several GPUs with torchrun gives the same pixels)."""
    from sdperf.imagegen import generate_folder

    summary = generate_folder(study.profile, captions, out_dir, guidance_scales=list(guidance_scales), dtype=dtype,
                              steps=steps, progress=False)
    manifest = read_manifest(out_dir)
    if say:
        say(f"  {summary.generated} images generated, {len(manifest)} in {Path(out_dir).name}")
    return manifest


def read_manifest(folder: Path) -> pd.DataFrame:
    """The manifest of a generated-image folder, with every image it names present."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ConfigError(f"image folder {str(folder)!r} has no {MANIFEST}; expected a folder written by "
                          f"sdperf generate or sdperf.quality.images (columns {', '.join(REQUIRED)})")
    df = pd.read_csv(path, dtype={"prompt_id": str, "key": str, "file": str}, keep_default_na=False)
    lacking = [c for c in REQUIRED if c not in df.columns]
    if lacking:
        raise ConfigError(f"{str(path)!r} lacks column(s) {', '.join(lacking)}; expected {', '.join(REQUIRED)}")
    missing = [f for f in df["file"] if not (folder / f).is_file()]
    if missing:
        raise ConfigError(f"{str(path)!r} names {len(missing)} image(s) that are not in the folder, "
                          f"e.g. {missing[0]!r}")
    df["guidance"] = df["guidance"].astype(float)
    df["path"] = [str(folder / f) for f in df["file"]]
    return df


def load_for_scoring(paths: list, size: int | None) -> tuple[torch.Tensor, list[Image.Image]]:
    """(uint8 NCHW tensor for Inception, the same images as PIL for CLIP), resized to size x size if given."""
    pil = []
    for p in paths:
        with Image.open(p) as im:
            im = im.convert("RGB")
            if size and im.size != (size, size):
                im = im.resize((size, size), RESIZE)
            pil.append(im.copy())
    arr = np.stack([np.asarray(im) for im in pil])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous(), pil


def image_files(folder: Path) -> list[Path]:
    from sdperf.quality.settings import IMAGE_SUFFIXES

    return sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def standin_images(n: int, size: int, seed: int) -> torch.Tensor:
    """Seeded smooth colour fields as uint8 images: a reference set for the machinery when no real images are
    given. FID against them says nothing about image quality; labels say so wherever they appear."""
    g = torch.Generator("cpu").manual_seed(seed)
    coarse = torch.rand(n, 3, 8, 8, generator=g)
    fine = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
    return (fine.clamp(0, 1) * 255).round().to(torch.uint8)
