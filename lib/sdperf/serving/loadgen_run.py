"""MLPerf LoadGen driving a serving design: the figures are LoadGen's own (its clock, its percentiles).

A sample is one image (library index i is the seed `seed_base + i`); the SUT's dispatcher sends the samples already
waiting, up to `batch_size`, as one request (it never waits to fill a batch) and blocks while `concurrency` requests
are inside the design (back-pressure), so the wait at the SUT's door is part of a sample's latency. Offline issues
every sample at t=0 in one query, so requests are full batches and its latencies measure the time to drain, not a
request's. Server: one-sample queries arrive as a Poisson process at `server_target_qps`; latency runs from each
query's scheduled arrival to its completion.
"""
from __future__ import annotations

import json
import queue
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import mlperf_loadgen as lg

from sdperf.store.results import atomic_write_text
from sdperf.serving.pipeline import StagePipeline
from sdperf.serving.stages import Request

PERCENTILES = ("50.00", "90.00", "95.00", "97.00", "99.00", "99.90")


@dataclass
class SUT:
    """The system under test LoadGen calls: samples in at issue(), QuerySamplesComplete from the design's workers."""

    design: StagePipeline
    batch_size: int
    seed_base: int
    keep_images: bool = True
    images: dict = field(default_factory=dict)  # request seeds -> images, to compare designs afterwards
    failures: list = field(default_factory=list)
    requests: int = 0

    def __post_init__(self):
        self._door: queue.Queue = queue.Queue()  # samples waiting for the dispatcher (not inside the design)
        self._lock = threading.Lock()
        self._dispatcher = threading.Thread(target=self._dispatch, name="sut-dispatcher", daemon=True)
        self._dispatcher.start()

    def issue(self, samples) -> None:
        for s in samples:
            self._door.put(s)

    def flush(self) -> None:
        """LoadGen's FlushQueries: nothing is held back waiting for a fuller batch, so nothing to flush."""

    def stop(self) -> None:
        self._door.put(None)
        self._dispatcher.join()

    def _dispatch(self) -> None:
        while (first := self._door.get()) is not None:
            batch = [first]
            stop = False
            while len(batch) < self.batch_size:
                try:
                    nxt = self._door.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            request = Request(tuple(self.seed_base + s.index for s in batch))
            self.requests += 1
            try:
                future = self.design.submit(request)  # blocks while `concurrency` requests are inside
            except Exception as exc:  # e.g. a closed design: fail the request, never leave LoadGen waiting
                future = Future()
                future.set_exception(exc)
            future.add_done_callback(lambda f, b=batch, r=request: self._complete(f, b, r))
            if stop:
                break

    def _complete(self, future, batch, request: Request) -> None:
        error = future.exception()
        with self._lock:
            if error is not None:
                self.failures.append(f"seeds {request.seeds}: {type(error).__name__}: {error}")
            elif self.keep_images:
                self.images[request.seeds] = future.result()
        # a failed sample is still reported complete, or LoadGen would wait for it forever; the run is marked failed
        lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0) for s in batch])


def loadgen_settings(scenario: str, *, min_duration_ms: int, min_query_count: int, single_rate: float,
                  single_latency_s: float, server_load: float, latency_factor: float) -> "lg.TestSettings":
    """PerformanceOnly settings; the expected/target rates derive from the measured single-request rate."""
    ts = lg.TestSettings()
    ts.scenario = getattr(lg.TestScenario, scenario)
    ts.mode = lg.TestMode.PerformanceOnly
    ts.min_duration_ms = min_duration_ms
    ts.min_query_count = min_query_count  # Offline: samples in its one query (LoadGen takes the larger of this
    ts.offline_expected_qps = single_rate  # and 1.1 x expected qps x min duration)
    ts.server_target_qps = server_load * single_rate
    ts.server_target_latency_ns = int(latency_factor * single_latency_s * 1e9)
    return ts


def read_detail(path: Path) -> dict:
    """LoadGen's detail log as {key: value} (its `:::MLLOG {json}` lines; later entries win)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith(":::MLLOG "):
            entry = json.loads(line[len(":::MLLOG "):])
            out[entry["key"]] = entry["value"]
    return out


def figures(detail: dict) -> dict:
    """The run's figures in seconds and images/s, named as in MLPerf's summary."""
    scenario = detail["effective_scenario"]
    rate = detail.get("result_samples_per_second", detail.get("result_completed_samples_per_sec"))
    out = {"scenario": scenario, "throughput_img_s": rate, "validity": detail["result_validity"],
           "min_duration_met": detail.get("result_min_duration_met"),
           "min_queries_met": detail.get("result_min_queries_met"),
           "perf_constraints_met": detail.get("result_perf_constraints_met"),
           "early_stopping_met": detail.get("early_stopping_met"),
           "scheduled_img_s": detail.get("result_scheduled_samples_per_sec"),
           "target_qps": detail.get("effective_target_qps"), "queries": detail.get("result_query_count"),
           "samples": detail.get("effective_samples_per_query", 1) * detail.get("result_query_count", 0),
           "errors": detail.get("num_errors", 0)}
    for p in PERCENTILES:
        ns = detail.get(f"result_{p}_percentile_latency_ns")
        out[f"latency_p{p.rstrip('0').rstrip('.')}_s"] = None if ns is None else ns / 1e9
    out["latency_mean_s"] = detail["result_mean_latency_ns"] / 1e9
    return out


def run(design: StagePipeline, settings: "lg.TestSettings", *, batch_size: int, seed_base: int,
        performance_samples: int, summary_to: Path | None = None) -> tuple[dict, SUT]:
    """One LoadGen test of one design; LoadGen's logs go to a temp folder, its summary is kept at `summary_to`."""
    sut = SUT(design, batch_size, seed_base)
    handle = lg.ConstructSUT(sut.issue, sut.flush)
    qsl = lg.ConstructQSL(performance_samples, performance_samples, lambda idx: None, lambda idx: None)
    try:
        with tempfile.TemporaryDirectory(prefix="sdperf-loadgen-") as tmp:
            log = lg.LogSettings()
            log.log_output.outdir = tmp
            log.log_output.copy_summary_to_stdout = False
            log.enable_trace = False
            lg.StartTestWithLogSettings(handle, qsl, settings, log)
            detail = read_detail(Path(tmp) / "mlperf_log_detail.txt")
            if summary_to is not None:
                atomic_write_text(summary_to, (Path(tmp) / "mlperf_log_summary.txt").read_text())
    finally:
        sut.stop()
        lg.DestroyQSL(qsl)
        lg.DestroySUT(handle)
    return dict(figures(detail), requests=sut.requests, failed_requests=len(sut.failures)), sut
