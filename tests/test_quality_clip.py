"""CLIP score: max(100 cos, 0) per pair, checked with a model whose answer is known and against a direct
computation through a real open_clip architecture (random init: this checks the arithmetic, not CLIP)."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from sdperf.core.errors import ConfigError
from sdperf.quality import clip

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


class _ColourModel(torch.nn.Module):
    """Image embedding = mean RGB; text embedding = the RGB of the colour word: cos is 1 for a match, 0 else."""

    def encode_image(self, x):
        return x.mean(dim=(2, 3))

    def encode_text(self, tokens):
        return tokens


def _colour_scorer() -> clip.ClipScorer:
    def tokenizer(texts):
        return torch.tensor([COLOURS[t.split()[-1]] for t in texts], dtype=torch.float32)

    def preprocess(im):
        return torch.from_numpy(__import__("numpy").asarray(im, dtype="float32")).permute(2, 0, 1) / 255

    return clip.ClipScorer(_ColourModel(), tokenizer, preprocess)


def _solid(name, size=8):
    return Image.new("RGB", (size, size), COLOURS[name])


def test_matching_pairs_score_higher_than_shuffled_ones_with_a_known_model():
    scorer = _colour_scorer()
    names = ["red", "green", "blue"]
    images = [_solid(n) for n in names]
    matched = scorer.scores(images, [f"a plain {n}" for n in names])
    shuffled = scorer.scores(images, [f"a plain {n}" for n in names[1:] + names[:1]])
    torch.testing.assert_close(matched, torch.full((3,), 100.0, dtype=torch.float64))
    torch.testing.assert_close(shuffled, torch.zeros(3, dtype=torch.float64))
    assert matched.mean() > shuffled.mean()


def test_scores_are_clamped_into_0_100():
    img = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.6, 0.8]])
    txt = torch.tensor([[-1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    torch.testing.assert_close(clip.pair_scores(img, txt), torch.tensor([0.0, 100.0, 80.0], dtype=torch.float64))
    rnd = clip.pair_scores(torch.randn(50, 16), torch.randn(50, 16))
    assert ((rnd >= 0) & (rnd <= 100)).all()


def test_open_clip_scorer_matches_a_direct_computation():
    scorer = clip.load("ViT-B-32")  # random init, no file: the CI path
    images = [Image.new("RGB", (64, 64), c) for c in COLOURS.values()]
    texts = ["a red square", "a green square", "a blue square"]
    got = scorer.scores(images, texts)
    with torch.inference_mode():
        im = scorer.model.encode_image(torch.stack([scorer.preprocess(i) for i in images]))
        tx = scorer.model.encode_text(scorer.tokenizer(texts))
    # the batched feature calls are the model's own, and the score is the clamped cosine of them
    torch.testing.assert_close(scorer.image_features(images, batch=2), im.float())
    torch.testing.assert_close(scorer.text_features(texts), tx.float())
    im, tx = im / im.norm(dim=-1, keepdim=True), tx / tx.norm(dim=-1, keepdim=True)
    direct = torch.clamp(100 * (im * tx).sum(-1), min=0).double()
    torch.testing.assert_close(got, direct, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="got 3 images, 2 captions"):
        scorer.scores(images, texts[:2])


def test_missing_clip_weights_name_the_path_and_what_was_expected(tmp_path):
    path = tmp_path / "open_clip_pytorch_model.bin"
    with pytest.raises(ConfigError) as err:
        clip.load("ViT-L-14", path)
    assert str(path) in str(err.value) and "open_clip checkpoint" in str(err.value) and "ViT-L-14" in str(err.value)
