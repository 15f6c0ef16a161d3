"""The study's own text-to-image model and the evaluator that judges it.

No Stable Diffusion, CLIP or Inception weights can be downloaded here, so quality figures on random weights mean
nothing. This package generates a captioned image domain with exact ground truth (`domain`), trains a small CNN
that reads that ground truth back from an image (`evaluator`: prompt adherence and a domain FID), and trains a
latent diffusion model of Stable Diffusion's own architecture family on it (`model`, `train`), stored with its
checksums and provenance (`store`) and judged by `quality`. Speed is still measured on SD 1.5 at random init;
quality deltas are measured on this model.
"""
