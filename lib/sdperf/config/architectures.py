"""Hand-written configs of the real SD 1.5, SD 2-base and SDXL networks (and tiny twins for CI), transcribed from
their diffusers configs (tests check the parameter counts): timing does not depend on weights, so random init does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Published parameter counts of the real networks (diffusers/transformers, random init gives the same shape).
PUBLISHED_PARAMETERS = {
    "sd15": {"unet": 859_520_964, "vae": 83_653_863, "text_encoder": 123_060_480},
    "sd2-base": {"unet": 865_910_724, "vae": 83_653_863, "text_encoder": 340_387_840},
    "sdxl": {"unet": 2_567_463_684, "vae": 83_653_863, "text_encoder": 123_060_480,
             "text_encoder_2": 694_659_840},
}

_SD_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32,
               block_out_channels=[128, 256, 512, 512], act_fn="silu",
               down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4)
# SD 1.5's and SD 2-base's UNet layout (they differ in attention heads, cross-attention width and projection)
_SD_UNET = dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                block_out_channels=[320, 640, 1280, 1280], up_block_types=["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
                down_block_types=["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"])
_CLIP_L = dict(  # CLIP ViT-L/14 text tower (SD 1.x, first SDXL encoder)
    vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768,
)
_SCHEDULER = dict(  # shared by all three: scaled-linear betas, epsilon prediction
    num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
    steps_offset=1, prediction_type="epsilon",
)


_TINY_UNET = dict(sample_size=32, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=[32, 64],
                  norm_num_groups=32, down_block_types=["DownBlock2D", "CrossAttnDownBlock2D"],
                  up_block_types=["CrossAttnUpBlock2D", "UpBlock2D"])
_TINY_VAE = dict(_SD_VAE, block_out_channels=[32, 64], down_block_types=["DownEncoderBlock2D"] * 2,
                 up_block_types=["UpDecoderBlock2D"] * 2, sample_size=64)
_TINY_TEXT = dict(vocab_size=49408, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=32)


@dataclass(frozen=True)
class Architecture:
    """Everything needed to instantiate one pipeline family."""

    name: str
    family: str  # "sd" (StableDiffusionPipeline) or "sdxl" (StableDiffusionXLPipeline)
    unet: dict
    vae: dict
    text_encoder: dict
    text_encoder_2: dict | None = None
    pad_token: str = "<|endoftext|>"
    pad_token_2: str = "!"
    scheduler: dict = field(default_factory=lambda: dict(_SCHEDULER))

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae["block_out_channels"]) - 1)


ARCHS: dict[str, Architecture] = {
    "sd15": Architecture(
        name="sd15", family="sd",
        unet=dict(_SD_UNET, attention_head_dim=8, cross_attention_dim=768),
        vae=dict(_SD_VAE, sample_size=512, scaling_factor=0.18215),
        text_encoder=dict(_CLIP_L),
    ),
    "sd2-base": Architecture(
        name="sd2-base", family="sd", pad_token="!",
        unet=dict(_SD_UNET, attention_head_dim=[5, 10, 20, 20], cross_attention_dim=1024, use_linear_projection=True),
        vae=dict(_SD_VAE, sample_size=512, scaling_factor=0.18215),
        # OpenCLIP ViT-H/14 text tower, penultimate layer: 23 of its 24 layers, as SD 2 ships it.
        text_encoder=dict(_CLIP_L, hidden_size=1024, intermediate_size=4096, num_hidden_layers=23,
                          num_attention_heads=16, hidden_act="gelu", projection_dim=512),
    ),
    "sdxl": Architecture(
        name="sdxl", family="sdxl",
        unet=dict(
            sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=[320, 640, 1280], attention_head_dim=[5, 10, 20], cross_attention_dim=2048,
            transformer_layers_per_block=[1, 2, 10], use_linear_projection=True,
            down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
            up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
            addition_embed_type="text_time", addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816,
        ),
        vae=dict(_SD_VAE, sample_size=1024, scaling_factor=0.13025, force_upcast=True),
        text_encoder=dict(_CLIP_L),
        # OpenCLIP ViT-bigG/14 text tower with projection.
        text_encoder_2=dict(_CLIP_L, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                            num_attention_heads=20, hidden_act="gelu", projection_dim=1280),
    ),
    # The study's own reference model (sdperf.refmodel), trained on the shapes domain at 32 px: SD's components at a
    # few million parameters; its VAE downsamples 4x, its scaling factor is set from the trained latents.
    "sdref": Architecture(
        name="sdref", family="sd",
        unet=dict(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=[64, 128],
                  norm_num_groups=32, attention_head_dim=8, cross_attention_dim=64,
                  down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                  up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]),
        vae=dict(_SD_VAE, block_out_channels=[32, 64, 64], layers_per_block=1, norm_num_groups=16,
                 down_block_types=["DownEncoderBlock2D"] * 3, up_block_types=["UpDecoderBlock2D"] * 3,
                 sample_size=32, scaling_factor=1.0),
        text_encoder=dict(_TINY_TEXT, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, projection_dim=64),
    ),
    # Tiny twins: same code path, same tokenizer, seconds on a CPU. Shapes follow diffusers' own unit tests.
    "tiny": Architecture(
        name="tiny", family="sd",
        unet=dict(_TINY_UNET, attention_head_dim=8, cross_attention_dim=32),
        vae=dict(_TINY_VAE, scaling_factor=0.18215),
        text_encoder=dict(_TINY_TEXT),
    ),
    "tiny-sdxl": Architecture(
        name="tiny-sdxl", family="sdxl",
        unet=dict(
            _TINY_UNET, attention_head_dim=[2, 4], cross_attention_dim=64, transformer_layers_per_block=[1, 2],
            use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=80,  # 6 time ids * 8 + pooled 32
        ),
        vae=dict(_TINY_VAE, scaling_factor=0.13025, force_upcast=True),
        text_encoder=dict(_TINY_TEXT),
        text_encoder_2=dict(_TINY_TEXT, hidden_act="gelu"),
    ),
}


def get(name: str) -> Architecture:
    from sdperf.core.errors import ConfigError

    if name not in ARCHS:
        raise ConfigError(f"unknown architecture {name!r}; valid architectures: {', '.join(ARCHS)}")
    return ARCHS[name]


def vae_scale_factor(name: str) -> int:
    return get(name).vae_scale_factor


def count_parameters(module) -> int:
    return sum(p.numel() for p in module.parameters())
