"""sdperf: a rerunnable study of Stable Diffusion inference speed and what each optimization costs in quality."""
from sdperf.core import quiet as _quiet

__version__ = "0.1.0"

# The pinned libraries' known, harmless warnings (each named with its reason in sdperf.core.quiet), filtered before any
# of them is imported: every notebook, worker and command imports sdperf first.
_quiet.install()
