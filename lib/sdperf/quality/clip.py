"""CLIP score = max(100 * cos(image, text), 0), per image-caption pair, with open_clip from local weights.

torchmetrics' CLIPScore goes through transformers' CLIPModel, whose feature call returns an output object in
transformers 5 that CLIPScore does not expect; open_clip returns tensors. ViT-L/14 is NeMo's model, ViT-B/32 MLPerf's.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from sdperf.core.errors import ConfigError


@dataclass
class ClipScorer:
    """Anything with encode_image/encode_text, its tokenizer and its image preprocessing (PIL -> tensor)."""

    model: Any
    tokenizer: Callable
    preprocess: Callable
    arch: str = ""
    weights: Path | None = None

    @torch.inference_mode()
    def image_features(self, images: list, batch: int = 16) -> torch.Tensor:
        out = [self.model.encode_image(torch.stack([self.preprocess(im) for im in images[i:i + batch]]))
               for i in range(0, len(images), batch)]
        return torch.cat(out).float()

    @torch.inference_mode()
    def text_features(self, texts: list[str], batch: int = 64) -> torch.Tensor:
        out = [self.model.encode_text(self.tokenizer(texts[i:i + batch])) for i in range(0, len(texts), batch)]
        return torch.cat(out).float()

    def scores(self, images: list, texts: list[str], batch: int = 16) -> torch.Tensor:
        """One score per (image, caption) pair, in [0, 100]."""
        if len(images) != len(texts):
            raise ValueError(f"CLIP score pairs images with captions: got {len(images)} images, {len(texts)} captions")
        return pair_scores(self.image_features(images, batch), self.text_features(texts))


def pair_scores(image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
    """max(100 * cos, 0) of row i of each (torchmetrics' CLIPScore definition)."""
    cos = torch.nn.functional.cosine_similarity(image_features.double(), text_features.double(), dim=-1)
    return (100 * cos).clamp(min=0)


def load(arch: str, weights: Path | None = None, seed: int = 0) -> ClipScorer:
    """open_clip `arch` from a local checkpoint, or at a seeded random init when weights is None."""
    import open_clip

    if weights is not None and not Path(weights).is_file():
        raise ConfigError(f"CLIP weights {str(weights)!r} do not exist; expected an open_clip checkpoint file "
                          f"for {arch} (e.g. open_clip_pytorch_model.bin)")
    pretrained = str(Path(weights).resolve()) if weights is not None else None
    # open_clip logs a warning for a random init; this module says so itself (ClipScorer.weights is None)
    with _quiet(logging.getLogger()), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # weights_only: a crafted checkpoint is refused by torch's unpickler instead of running its code
        model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=pretrained, weights_only=True)
    return ClipScorer(model.eval(), open_clip.get_tokenizer(arch), preprocess, arch, weights)


@contextlib.contextmanager
def _quiet(logger: logging.Logger):
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
