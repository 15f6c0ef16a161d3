"""sdperf: a rerunnable study of Stable Diffusion inference speed and what each optimization costs in quality."""
import logging as _logging

__version__ = "0.1.0"

# diffusers imports torchao whenever it is installed, and torchao 0.18 registers Enum pytree constants that
# torch 2.14 deprecates: one warning per enum on stderr, in whichever notebook cell first builds a pipeline.
# It says nothing about the study, so only that logger is quietened.
_logging.getLogger("torch.utils._pytree").setLevel(_logging.ERROR)
