"""The dataset: the pipeline's own VAE and text encoder make it, from user images or generated patterns."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from sdperf.training import dataset, training_settings


@pytest.fixture(scope="module")
def smoke_settings(smoke):
    return training_settings.from_profile(smoke)


def test_encoded_dataset_has_the_unets_shapes(smoke, smoke_settings):
    s = dataclasses.replace(smoke_settings, data="encoded", samples=3)
    tensors, what = dataset.make(smoke, s)
    assert "generated test patterns" in what and "VAE encoder" in what
    assert tensors["latents"].shape == (3, 4, 32, 32) and tensors["embeds"].shape == (3, 77, 32)
    assert torch.isfinite(tensors["latents"]).all()
    again, _ = dataset.make(smoke, s)
    assert torch.equal(again["latents"], tensors["latents"])  # seeded end to end


def test_user_images_and_their_captions_are_used(smoke, smoke_settings, tmp_path):
    from PIL import Image

    for i, color in enumerate([(255, 0, 0), (0, 0, 255)]):
        Image.new("RGB", (80, 64), color).save(tmp_path / f"img{i}.png")
    (tmp_path / "img0.txt").write_text("a red square")
    images, captions = dataset.user_images(str(tmp_path), 64, 3, "default prompt")
    assert images.shape == (3, 3, 64, 64) and images.min() >= -1 and images.max() <= 1
    assert captions == ["a red square", "default prompt", "a red square"]  # cycled, sidecar captions first
    s = dataclasses.replace(smoke_settings, data="encoded", samples=2, images_dir=str(tmp_path))
    tensors, what = dataset.make(smoke, s)
    assert str(tmp_path) in what
    assert not torch.equal(tensors["latents"][0], tensors["latents"][1])  # red and blue encode differently
    assert not torch.equal(tensors["embeds"][0], tensors["embeds"][1])  # two captions, two embeddings


def test_an_empty_image_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        dataset.user_images(str(tmp_path), 64, 1, "p")


def test_dataset_file_round_trips(tmp_path):
    tensors = dataset.synthetic("tiny-sdxl", 64, 4, seed=1)
    ds = dataset.load(dataset.save(tmp_path / "d.pt", tensors))
    assert len(ds) == 4 and set(ds[0]) == {"latents", "embeds", "text_embeds", "time_ids"}
    assert ds[0]["time_ids"].tolist() == [64, 64, 0, 0, 64, 64]


def test_too_few_samples_for_one_step_is_refused():
    ds = dataset.LatentDataset(dataset.synthetic("tiny", 64, 3, seed=0))
    with pytest.raises(ValueError, match="3 samples cannot fill one step of 2 ranks x 2"):
        next(dataset.batches(ds, 2, 0, 2, seed=0))
