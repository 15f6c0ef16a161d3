"""LoadGen driving a design: the SUT batches what is waiting, reports every sample, and the figures come from
LoadGen's own log. A fast fake design (a short sleep per request) keeps each run well under a second."""
from __future__ import annotations

import math
import time

import pytest

from sdperf.serving import loadgen_run
from sdperf.serving.pipeline import Stage, StagePipeline


def _design(concurrency: int, fail_seed: int | None = None) -> StagePipeline:
    def serve(request):
        time.sleep(0.01 * len(request.seeds))
        if fail_seed in request.seeds:
            raise RuntimeError(f"seed {fail_seed} failed")
        return list(request.seeds)
    return StagePipeline([Stage("serve", serve, workers=concurrency)], max_in_flight=concurrency,
                         queue_depth=concurrency)


def _settings(scenario: str, queries: int):
    return loadgen_run.loadgen_settings(scenario, min_duration_ms=100, min_query_count=queries, single_rate=50.0,
                                        single_latency_s=0.02, server_load=1.0, latency_factor=4)


@pytest.mark.parametrize("batch", [1, 3])
def test_offline_batches_what_waits_and_reads_figures_from_loadgen(tmp_path, batch):
    summary = tmp_path / "summary.txt"
    with _design(2) as design:
        figs, sut = loadgen_run.run(design, _settings("Offline", 10), batch_size=batch, seed_base=100,
                                    performance_samples=8, summary_to=summary)
    assert figs["scenario"] == "Offline" and figs["samples"] >= 10 and figs["throughput_img_s"] > 0
    assert figs["requests"] == math.ceil(figs["samples"] / batch)  # all samples wait at t=0: full batches
    assert all(100 <= s < 108 for seeds in sut.images for s in seeds)  # sample index i is seed 100 + i
    assert "Scenario : Offline" in summary.read_text() and figs["failed_requests"] == 0


def test_server_reports_latency_percentiles_in_order(tmp_path):
    with _design(1) as design:
        figs, _ = loadgen_run.run(design, _settings("Server", 6), batch_size=1, seed_base=0, performance_samples=4)
    assert figs["scenario"] == "Server" and figs["queries"] >= 6
    assert 0 < figs["latency_p50_s"] <= figs["latency_p95_s"] <= figs["latency_p99_s"]
    assert figs["target_qps"] == pytest.approx(50.0)


def test_a_failed_request_is_counted_and_loadgen_still_finishes():
    with _design(2, fail_seed=0) as design:
        figs, sut = loadgen_run.run(design, _settings("Offline", 8), batch_size=1, seed_base=0,
                                    performance_samples=2)
    assert figs["failed_requests"] == len(sut.failures) > 0
    assert all("seed 0 failed" in f for f in sut.failures)


def test_detail_log_is_read_as_key_values(tmp_path):
    log = tmp_path / "mlperf_log_detail.txt"
    log.write_text(':::MLLOG {"key": "result_validity", "value": "VALID", "time_ms": 1}\n'
                   'noise line\n:::MLLOG {"key": "result_validity", "value": "INVALID", "time_ms": 2}\n')
    assert loadgen_run.read_detail(log) == {"result_validity": "INVALID"}


def test_a_design_that_refuses_requests_fails_them_without_hanging_loadgen():
    design = _design(1)
    design.close()
    figs, sut = loadgen_run.run(design, _settings("Offline", 4), batch_size=2, seed_base=0, performance_samples=4)
    assert figs["failed_requests"] == figs["requests"] == math.ceil(figs["samples"] / 2) > 0
    assert "closed" in sut.failures[0]


def test_a_runs_rows_name_how_they_were_taken(tmp_path, scratch_reports):
    """Throughput and the Server latencies are one LoadGen run each, not rounds: every row's method says so, with
    the design, the requests in flight and the batch; a run with failed requests is a failed row instead."""
    from sdperf.experiments import serving
    from sdperf.measure.study import open_study

    with _design(2) as design:
        figs, _ = loadgen_run.run(design, _settings("Server", 4), batch_size=1, seed_base=0, performance_samples=4)
    study = open_study("smoke", notebook="test_serving_loadgen")
    run = {"design": "staged", "scenario": "Server", "concurrency": 2, "batch_size": 1, **figs, "threads": 1,
           "min_duration_ms": 100, "min_query_count": 4}
    serving._record_run(study, run)
    rows = study.recorder.table().set_index("metric")
    assert set(rows.index) == {"throughput", "latency_p50", "latency_p95", "latency_p99"}
    assert (rows.method == serving.run_method(run)).all()
    method = rows.method.iloc[0]
    assert "one MLPerf LoadGen Server run (no rounds)" in method and "2 request(s) in flight" in method
    serving._record_run(study, dict(run, design="stacked", failed_requests=1))
    failed = study.recorder.table()
    assert failed[failed.scenario.str.startswith("stacked")].status.tolist() == ["failed"]
