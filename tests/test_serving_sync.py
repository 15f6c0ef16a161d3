"""The sync counter: it finds a planted read-back, attributes it to its step, ignores host tensors, and the loop
with host values reads nothing back while giving the same latents."""
from __future__ import annotations

import pytest
import torch

from sdperf.model.generation import Workload
from sdperf.serving import sync_audit
from sdperf.serving.sync_audit import SyncCounter


def test_planted_item_is_found_in_its_step_and_host_reads_are_not():
    counter = SyncCounter()
    on_device, on_host = torch.ones(3), torch.ones(3)
    counter.place(on_device)
    with counter:
        for step in range(3):
            with counter.clock("unet"):
                y = on_device * 2  # derived from a device tensor: on the device too
                on_host.sum().item()  # a host value: no sync anywhere
                if step == 1:
                    y.sum().item()  # the planted sync
    assert counter.per_step() == [0, 1, 0]
    (event,) = counter.events
    assert event.op == ".item()"
    assert event.site == "test_serving_sync.py:test_planted_item_is_found_in_its_step_and_host_reads_are_not"


@pytest.mark.parametrize("read_back,op", [(lambda t: bool(t.sum() > 0), "bool(tensor)"),
                                         (lambda t: t.tolist(), ".tolist()"),
                                         (lambda t: torch.arange(5)[t[0].long()], "index by a device scalar/mask"),
                                         (lambda t: t.nonzero(), ".nonzero()")])
def test_each_kind_of_read_back_is_named(read_back, op):
    counter = SyncCounter()
    t = torch.ones(2)
    counter.place(t)
    with counter:
        read_back(t)
    assert [e.op for e in counter.events] == [op]


@pytest.fixture(scope="module")
def inputs(tiny_pipe, smoke):
    return sync_audit.LoopInputs.make(tiny_pipe, Workload.from_profile(smoke, 1))


def test_host_values_loop_reads_nothing_back_and_gives_the_same_latents(tiny_pipe, inputs):
    before = sync_audit.count(tiny_pipe, inputs, "diffusers loop", "plms")
    after = sync_audit.count(tiny_pipe, inputs, "host values", "plms")
    assert sum(before.per_step()) > 0 and after.events == []
    assert before.steps == after.steps > 0
    same = [sync_audit.run_loop(tiny_pipe, inputs, v, "plms") for v in sync_audit.VARIANTS]
    assert torch.equal(*same)


def test_planted_item_in_the_scheduler_step_is_counted_every_step(tiny_pipe, inputs, monkeypatch):
    import diffusers

    original = diffusers.PNDMScheduler.step

    def step_with_item(self, model_output, *args, **kwargs):
        model_output.abs().max().item()  # what a "check for NaNs" line in a scheduler would do
        return original(self, model_output, *args, **kwargs)

    monkeypatch.setattr(diffusers.PNDMScheduler, "step", step_with_item)
    counter = sync_audit.count(tiny_pipe, inputs, "host values", "plms")
    assert counter.per_step() == [1] * counter.steps
    assert {(e.stage, e.op) for e in counter.events} == {("scheduler", ".item()")}


def test_unknown_variant_names_the_choices(tiny_pipe, inputs):
    with pytest.raises(ValueError, match=r"'fast'.*diffusers loop, host values"):
        sync_audit.run_loop(tiny_pipe, inputs, "fast", "plms")
