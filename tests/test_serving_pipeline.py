"""The stage-pipeline engine on plain Python stages: back-pressure, admission bound, failure isolation, drain."""
from __future__ import annotations

import threading
import time

import pytest

from sdperf.serving.pipeline import Saturated, Stage, StagePipeline


def _gated(gate: threading.Event):
    def stage(x):
        gate.wait(10)
        return x
    return stage


def test_full_queue_blocks_the_caller_instead_of_growing():
    gate = threading.Event()
    pipe = StagePipeline([Stage("held", _gated(gate)), Stage("double", lambda x: 2 * x)], max_in_flight=50,
                         queue_depth=1)
    futures = [pipe.submit(0, timeout=5)]  # the worker takes it and waits at the gate
    deadline = time.monotonic() + 5
    while pipe.queues[0].qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    futures.append(pipe.submit(1, timeout=5))  # fills the one-slot queue
    with pytest.raises(Saturated):
        pipe.submit(2, timeout=0.2)  # nowhere to go: the caller is told, nothing is queued
    assert pipe.queues[0].qsize() == 1 and max(pipe.high_water) <= 1
    gate.set()
    assert [f.result(timeout=10) for f in futures] == [0, 2]
    pipe.close(timeout=10)
    assert pipe.alive_workers == 0


def test_at_most_max_in_flight_requests_are_admitted():
    gate = threading.Event()
    pipe = StagePipeline([Stage("held", _gated(gate))], max_in_flight=2, queue_depth=10)
    first = [pipe.submit(i, timeout=5) for i in range(2)]
    with pytest.raises(Saturated, match="in flight"):
        pipe.submit(2, timeout=0.2)
    gate.set()
    assert [f.result(timeout=10) for f in first] == [0, 1]
    assert pipe.submit(3, timeout=5).result(timeout=10) == 3  # slots come back as requests finish
    pipe.close(timeout=10)


def _fails_on_three(x):
    if x == 3:
        raise ValueError(f"request {x} broke in the middle stage")
    return x + 100


@pytest.mark.parametrize("workers", [1, 3])
def test_a_failing_request_gets_its_error_and_the_others_complete(workers):
    stages = [Stage("first", lambda x: x, workers=workers), Stage("middle", _fails_on_three, workers=workers),
              Stage("last", lambda x: x * 10)]
    pipe = StagePipeline(stages, max_in_flight=4, queue_depth=2)
    futures = {i: pipe.submit(i) for i in range(8)}
    pipe.close(timeout=20)  # drains: everything submitted before close finishes
    assert pipe.alive_workers == 0
    with pytest.raises(ValueError, match="request 3 broke"):
        futures[3].result(timeout=0)
    assert {i: f.result(timeout=0) for i, f in futures.items() if i != 3} == {i: (i + 100) * 10 for i in range(8)
                                                                               if i != 3}


def test_closed_pipeline_refuses_new_requests():
    pipe = StagePipeline([Stage("id", lambda x: x)], max_in_flight=1, queue_depth=1)
    pipe.close(timeout=10)
    with pytest.raises(RuntimeError, match="closed"):
        pipe.submit(1)


def test_bad_bounds_are_rejected():
    with pytest.raises(ValueError, match="max_in_flight"):
        StagePipeline([Stage("id", lambda x: x)], max_in_flight=0, queue_depth=1)
