"""Reading generated-image folders for scoring: one resize method, the stand-in reference set.

Every scored image is made by `sdperf.imagegen.generate_folder` (`sdperf generate`), so one naming scheme and one
manifest reader serve the curve and the rungs. Images are stored as PNG: clean-fid showed that JPEG compression and
the resize filter each move FID by whole points, so nothing lossy happens between the VAE and the scorer, and the one
resize (`load_for_scoring`) is PIL bicubic, which antialiases.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from PIL import Image

from sdperf.imagegen import read_manifest
from sdperf.model.prompts import Caption

RESIZE = Image.Resampling.BICUBIC  # PIL's bicubic filter antialiases when shrinking (clean-fid's recommendation)


def generate_images(study, captions: list[Caption], guidance_scales, out_dir: Path, *, steps: int,
                    dtype: str = "float32", pipe=None, grad_mode: str = "inference_mode",
                    technique: str | None = None, say: Callable[[str], None] | None = None) -> pd.DataFrame:
    """One image per caption and guidance scale (caption i with seed profile.seed + i), through
    sdperf.imagegen.generate_folder: the folder `sdperf generate` would write. `pipe`, `grad_mode` and `technique`:
    a pipeline a catalog stack was applied to, as 12's rungs generate."""
    from sdperf.imagegen import generate_folder

    summary = generate_folder(study.profile, captions, out_dir, guidance_scales=list(guidance_scales), dtype=dtype,
                              steps=steps, progress=False, pipe=pipe, grad_mode=grad_mode, technique=technique)
    manifest = read_manifest(out_dir)
    if say:
        say(f"  {summary.generated} images generated, {len(manifest)} in {Path(out_dir).name}")
    return manifest


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
    from sdperf.quality.quality_settings import IMAGE_SUFFIXES

    return sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def standin_images(n: int, size: int, seed: int) -> torch.Tensor:
    """Seeded smooth colour fields as uint8 images: a reference set for the machinery when no real images are
    given. FID against them says nothing about image quality; labels say so wherever they appear."""
    g = torch.Generator("cpu").manual_seed(seed)
    coarse = torch.rand(n, 3, 8, 8, generator=g)
    fine = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
    return (fine.clamp(0, 1) * 255).round().to(torch.uint8)
