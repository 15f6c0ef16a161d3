"""sdperf: a rerunnable study of Stable Diffusion inference speed and what each optimization costs in quality."""
__version__ = "0.1.0"
