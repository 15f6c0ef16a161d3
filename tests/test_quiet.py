"""sdperf.core.quiet: each known warning and log line is filtered, an unknown one of the same category (or logger)
still shows, torch's guard-creation failure is one line, and `import sdperf` leaves the real noise off stderr."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from sdperf.core import quiet
from sdperf.optimizations import torch_compile as tc

# A message each known warning really printed (executed notebooks, worker logs), as (filter, message, module).
SEEN = {
    "IProgress": ("IProgress not found. Please update jupyter and ipywidgets. See https://ipywidgets.readthedocs.io/"
                  "en/stable/user_install.html", "tqdm.auto"),
    "install \"ipywidgets\"": ('install "ipywidgets" for Jupyter support', "rich.live"),
    "inline_inbuilt": ("torch._dynamo.config.inline_inbuilt_nn_modules is deprecated and does not do anything, "
                       "inline_inbuilt_nn_modules is always True.", "openvino.frontend.pytorch.torchdynamo.backend"),
    "jit.trace": ("`torch.jit.trace` is deprecated. Please switch to `torch.compile` or `torch.export`.",
                  "torch.jit._trace"),
    "Python boolean": ("Converting a tensor to a Python boolean might cause the trace to be incorrect. We can't "
                       "record the data flow of Python values", "diffusers.models.upsampling"),
    "is_gradient_checkpointing": ("`is_gradient_checkpointing` is deprecated and will be removed in v6. Use "
                                  "`is_activation_checkpointing` instead.", "transformers.modeling_utils"),
    "axis name": ("# The axis name: batch will not be used, since it shares the same shape constraints with another "
                  "axis: batch.", "torch.onnx._internal.exporter._onnx_program"),
}
LOGGED = {
    "torch.utils.cpp_extension": "No CUDA runtime is found, using CUDA_HOME='/usr/local'",
    "torch.utils._pytree": "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by "
                           "torch.compile as an opaque value type.",
    "diffusers.quantizers.torchao.torchao_quantizer": "Unable to import `torchao` Tensor objects. This may affect "
                                                      "loading checkpoints serialized with `torchao`",
    "transformers.modeling_utils": "`loss_type=None` was set in the config but it is unrecognized. Using the "
                                   "default loss: `ForCausalLMLoss`.",
}


def _known(key: str) -> quiet.KnownWarning:
    matching = [k for k in quiet.WARNINGS if key in k.message.replace("\\", "")]
    assert len(matching) == 1, key
    return matching[0]


def _shown(message: str, category: type[Warning], module: str) -> list[str]:
    """What reaches the user of a warning issued from `module`, with the library's filters in front of 'always'."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.filter_warnings()
        warnings.warn_explicit(message, category, f"/site-packages/{module.replace('.', '/')}.py", 1, module=module,
                               registry={})
    return [str(w.message) for w in caught]


def test_every_filter_has_a_seen_message_and_a_reason():
    assert {_known(k) for k in SEEN} == set(quiet.WARNINGS)
    assert set(LOGGED) == {k.logger for k in quiet.LOG_RECORDS}
    for known in (*quiet.WARNINGS, *quiet.LOG_RECORDS):
        assert known.message and len(known.why) > 40


@pytest.mark.parametrize("key", list(SEEN))
def test_a_known_warning_is_filtered_and_an_unknown_one_of_its_category_shows(key):
    known = _known(key)
    category = quiet._category(known.category)
    message, module = SEEN[key]
    assert _shown(message, category, module) == []
    unknown = "Converting a tensor to a Python integer might cause the trace to be incorrect"
    assert _shown(unknown, category, module) == [unknown]
    if known.module:  # the same message from a module the filter does not name is news too
        assert _shown(message, category, "sdperf.somewhere") == [message]


def test_install_puts_back_the_filters_a_catch_warnings_block_dropped():
    with warnings.catch_warnings():
        warnings.resetwarnings()
        assert not quiet.warning_filters_in_force()
        quiet.install()
        assert quiet.warning_filters_in_force()
        count = len(warnings.filters)
        quiet.install()  # nothing twice
        assert len(warnings.filters) == count


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def collect():
    """A handler on a named logger (records reach it only past that logger's filters), removed afterwards."""
    attached = []

    def on(name: str) -> _Collect:
        handler, logger = _Collect(), logging.getLogger(name)
        attached.append((logger, handler, logger.level))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        return handler

    yield on
    for logger, handler, level in attached:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize("name", list(LOGGED))
def test_a_known_log_line_is_dropped_and_another_of_its_logger_kept(name, collect):
    handler = collect(name)
    logging.getLogger(name).warning(LOGGED[name])
    logging.getLogger(name).warning("something else went wrong")
    assert [r.getMessage() for r in handler.records] == ["something else went wrong"]


GUARD = ("Name: ''\n    Source: shape_env\n    Create Function: SHAPE_ENV\n    Guard Types: None\n"
         "    Code List: None")


def test_a_guard_creation_failure_is_one_line_and_other_errors_stay_whole(collect):
    """The three records torch 2.14 logs (symbolic_shapes.issue_guard, torch._guards.Guard.create) become one."""
    guards, shapes = collect("torch._guards"), collect("torch.fx.experimental.symbolic_shapes")
    shapes_log, guards_log = (logging.getLogger(n) for n in ("torch.fx.experimental.symbolic_shapes", "torch._guards"))
    try:
        shapes_log.warning("Failing guard allocated at %s", "(_refs/__init__.py:4124 in _reshape_view_helper)")
        raise IndexError("list index out of range")
    except IndexError:
        guards_log.exception("Error while creating guard:\n%s", GUARD)
        guards_log.error("Created at:\n%s", '  File "convert_frame.py", line 925, in trace_frame')
    assert shapes.records == []
    (line,) = [r.getMessage() for r in guards.records]
    assert "\n" not in line and guards.records[0].exc_info is None
    for part in ("SHAPE_ENV", "_refs/__init__.py:4124", "IndexError: list index out of range", "raises it"):
        assert part in line
    try:
        raise ValueError("another failure")
    except ValueError:
        guards_log.exception("Guard check failed:\n%s", GUARD)
    assert guards.records[-1].exc_info is not None and guards.records[-1].getMessage().count("\n") == 5


def _raise_from(filename: str):
    scope: dict = {}
    exec(compile("def create():\n    raise IndexError('list index out of range')\n", filename, "exec"), scope)
    try:
        scope["create"]()
    except IndexError as exc:
        return exc


def test_a_compile_failure_in_dynamos_guards_is_named_and_others_are_left_alone():
    err = tc.guard_failure(_raise_from("/venv/site-packages/torch/_guards.py"), "openvino")
    assert isinstance(err, tc.CompileError)
    assert str(err).startswith("torch.compile (backend openvino) failed while Dynamo built the traced UNet's guards")
    assert str(err).endswith("in create (torch/_guards.py:2): IndexError: list index out of range")
    assert tc.guard_failure(_raise_from("/venv/site-packages/diffusers/unet.py"), "openvino") is None


def test_the_profiler_log_level_is_set_only_without_a_gpu(monkeypatch):
    monkeypatch.delenv(quiet.KINETO_LEVEL_ENV, raising=False)
    quiet.quiet_profiler(gpu=True)
    assert quiet.KINETO_LEVEL_ENV not in os.environ
    quiet.quiet_profiler(gpu=False)
    assert os.environ[quiet.KINETO_LEVEL_ENV] == quiet.KINETO_QUIET
    monkeypatch.setenv(quiet.KINETO_LEVEL_ENV, "2")  # a user's own setting wins
    quiet.quiet_profiler(gpu=False)
    assert os.environ[quiet.KINETO_LEVEL_ENV] == "2"


def test_import_sdperf_keeps_the_real_noise_off_stderr():
    """The real thing in a fresh interpreter: torch's cpp_extension import (it logs "No CUDA runtime" when torch
    sees no GPU) and a torch.profiler run (kineto's lines) print nothing after `import sdperf`, while a warning the
    library does not know still does."""
    code = textwrap.dedent("""
        import sdperf, warnings, torch, torch.utils.cpp_extension
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]):
            torch.ones(2) + 1
        warnings.warn("an unknown warning", FutureWarning)
    """)
    env = {k: v for k, v in os.environ.items() if k != quiet.KINETO_LEVEL_ENV}
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env).stderr
    assert "No CUDA runtime" not in err and "USDT" not in err and "gpuGetDeviceCount" not in err, err
    assert "FutureWarning: an unknown warning" in err
