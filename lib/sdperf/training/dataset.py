"""What the UNet trains on: latents and text embeddings, made once and read by every rank.

"encoded" runs the profile's own VAE and text encoder (generation.encode) over user images (`images_dir`, captions
from a `.txt` beside each image, else the profile's prompt) or seeded test patterns; "synthetic" draws tensors of the
same shapes, for smoke runs. Precomputed latents are what MosaicML's throughput table assumes too (computing them while
training costs about 1.4x). Each rank draws its shard through a seeded DistributedSampler: disjoint and reproducible.

    python -m sdperf.training.dataset --profile cpu --out latents.pt    (make it once, e.g. for a multi-node run)
"""
from __future__ import annotations

import argparse
import io
from pathlib import Path

import torch

from sdperf.config import architectures
from sdperf.store.results import atomic_write_bytes

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
TEXT_TOKENS = 77  # CLIP's context length: every SD text encoder pads prompts to it


class LatentDataset(torch.utils.data.Dataset):
    """Rows of {latents, embeds[, text_embeds, time_ids]} tensors (the last two for SDXL's added conditioning)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors["latents"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.tensors.items()}


def latent_shape(arch: str, resolution: int) -> tuple[int, int, int]:
    a = architectures.get(arch)
    side = resolution // a.vae_scale_factor
    return (a.unet["in_channels"], side, side)


def time_ids(resolution: int, n: int) -> torch.Tensor:
    """SDXL's micro-conditioning (original size, crop top-left, target size) for square uncropped images."""
    return torch.tensor([[resolution, resolution, 0, 0, resolution, resolution]], dtype=torch.float32).repeat(n, 1)


def synthetic(arch: str, resolution: int, samples: int, seed: int) -> dict[str, torch.Tensor]:
    """Unit-variance latents (what VAE latents times the scaling factor approximate) and text embeddings."""
    a = architectures.get(arch)
    g = torch.Generator().manual_seed(seed)
    out = {"latents": torch.randn((samples, *latent_shape(arch, resolution)), generator=g),
           "embeds": torch.randn((samples, TEXT_TOKENS, a.unet["cross_attention_dim"]), generator=g)}
    if a.family == "sdxl":
        pooled = a.unet["projection_class_embeddings_input_dim"] - 6 * a.unet["addition_time_embed_dim"]
        out["text_embeds"] = torch.randn((samples, pooled), generator=g)
        out["time_ids"] = time_ids(resolution, samples)
    return out


def test_patterns(samples: int, resolution: int, seed: int) -> torch.Tensor:
    """Seeded smooth colour fields in [-1, 1]: images with image-like spatial statistics, no download needed."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn((samples, 3, 8, 8), generator=g)
    return torch.tanh(torch.nn.functional.interpolate(coarse, size=(resolution, resolution), mode="bicubic",
                                                      align_corners=False))


def user_images(folder: str, resolution: int, samples: int, default_caption: str) -> tuple[torch.Tensor, list[str]]:
    """The first `samples` images of a folder (sorted, cycled if fewer), centre-cropped and resized, in [-1, 1]."""
    from PIL import Image
    from torchvision.transforms import functional as F

    files = sorted(p for p in Path(folder).expanduser().iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {folder!r}")
    images, captions = [], []
    for i in range(samples):
        path = files[i % len(files)]
        img = Image.open(path).convert("RGB")
        img = F.center_crop(F.resize(img, resolution), [resolution, resolution])
        images.append(F.to_tensor(img) * 2 - 1)
        sidecar = path.with_suffix(".txt")
        captions.append(sidecar.read_text().strip() if sidecar.is_file() else default_caption)
    return torch.stack(images), captions


def encoded(profile, resolution: int, samples: int, images_dir: str | None) -> dict[str, torch.Tensor]:
    """Latents from the pipeline's VAE encoder and embeddings from its text encoder(s), one image at a time."""
    from sdperf.model.generation import Workload, encode
    from sdperf.model.pipelines import build_pipeline

    if images_dir:
        images, captions = user_images(images_dir, resolution, samples, profile.prompt)
    else:
        images, captions = test_patterns(samples, resolution, profile.seed), [profile.prompt] * samples
    pipe = build_pipeline(profile)
    device = profile.device
    g = torch.Generator().manual_seed(profile.seed)
    rows: dict[str, list] = {}
    cache: dict[str, tuple] = {}
    with torch.inference_mode():
        for image, caption in zip(images, captions):
            dist = pipe.vae.encode(image[None].to(device)).latent_dist
            latent = dist.sample(generator=g) * pipe.vae.config.scaling_factor
            if caption not in cache:
                w = Workload(prompt=caption, batch_size=1, steps=1, guidance_scale=1.0, height=resolution,
                             width=resolution, seed=profile.seed)
                cache[caption] = encode(pipe, w, device)
            embeds, extra = cache[caption]
            rows.setdefault("latents", []).append(latent[0])
            rows.setdefault("embeds", []).append(embeds[0])
            for key, value in extra.get("added_cond_kwargs", {}).items():
                rows.setdefault(key, []).append(value[0])
    return {k: torch.stack(v).float().cpu().contiguous() for k, v in rows.items()}


def make(profile, settings) -> tuple[dict[str, torch.Tensor], str]:
    """The dataset the settings ask for, and a line saying what it is."""
    if settings.data == "synthetic":
        return (synthetic(profile.arch, settings.resolution, settings.samples, profile.seed),
                f"synthetic: {settings.samples} random latent/embedding pairs (shapes of {profile.arch})")
    source = f"user images from {settings.images_dir}" if settings.images_dir else "seeded generated test patterns"
    return (encoded(profile, settings.resolution, settings.samples, settings.images_dir),
            f"encoded: {settings.samples} {source}, through {profile.arch}'s own VAE encoder and text encoder")


def save(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    buf = io.BytesIO()
    torch.save(tensors, buf)
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)


def load(path: Path) -> LatentDataset:
    return LatentDataset(torch.load(Path(path), weights_only=True))


def batches(dataset: LatentDataset, world_size: int, rank: int, batch_size: int, seed: int):
    """Endless per-rank batches: a DistributedSampler seeded with `seed`, reshuffled each epoch."""
    from torch.utils.data import DataLoader, DistributedSampler

    if len(dataset) < world_size * batch_size:
        raise ValueError(f"{len(dataset)} samples cannot fill one step of {world_size} ranks x {batch_size}")
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def main(argv: list[str] | None = None) -> int:
    from sdperf.config.profiles import load_profile
    from sdperf.training.training_settings import from_profile

    ap = argparse.ArgumentParser(prog="python -m sdperf.training.dataset", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    tensors, what = make(profile, from_profile(profile))
    save(args.out, tensors)
    print(f"{args.out}: {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
