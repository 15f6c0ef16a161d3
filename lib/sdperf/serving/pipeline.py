"""A queue-based stage pipeline: worker threads per stage, bounded queues between stages, a future per request.

While one request is in the UNet loop, the next can be in the text encoder and the previous in the VAE decoder (the
Google Cloud seed's "multi-threaded queue-based approach"): torch releases the GIL inside its ops, so the stages
overlap in native code. On CUDA each stage worker has its own stream and tensors stay on the device between stages
(an event orders them, `record_stream` tells the caching allocator). The stacked baseline is one all-in-one stage.
Tested: a full pipeline (`max_in_flight` requests inside, `queue_depth` per queue) blocks `submit` (back-pressure); a
stage's exception goes to its own request's future; `close()` lets submitted requests finish, then stops every worker.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

_STOP = object()


class Saturated(queue.Full):
    """submit() timed out: the pipeline is full (back-pressure) and the caller has to wait or shed load."""


@dataclass(frozen=True)
class Stage:
    name: str
    fn: Callable[[Any], Any]  # payload -> payload for the next stage (the last stage's is the request's result)
    workers: int = 1


@dataclass
class _Job:
    future: Future
    payload: Any
    ready: Any = None  # CUDA event the payload's tensors are complete at (None on the CPU)


def _adopt(payload, stream) -> None:
    """Tell the caching allocator that `stream` now uses the payload's device tensors too."""
    for leaf in tree_leaves(payload):
        if isinstance(leaf, torch.Tensor) and leaf.is_cuda:
            leaf.record_stream(stream)


class StagePipeline:
    """Requests go in with submit(payload) -> Future and come out of the last stage in the future's result."""

    def __init__(self, stages: list[Stage], *, max_in_flight: int, queue_depth: int, device: str = "cpu",
                 streams: bool = True, grad_mode: Callable = torch.inference_mode, name: str = "pipeline"):
        if max_in_flight < 1 or queue_depth < 1:
            raise ValueError(f"max_in_flight and queue_depth must be >= 1, got {max_in_flight}, {queue_depth}")
        self.stages, self.name, self.grad_mode = list(stages), name, grad_mode
        self.use_streams = streams and device == "cuda"
        self.device = device
        self.queues = [queue.Queue(maxsize=queue_depth) for _ in self.stages]
        self.queue_depth = queue_depth
        self.high_water = [0] * len(self.stages)  # the fullest each queue has been (never above queue_depth)
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._lock = threading.Lock()
        self._stopped = [0] * len(self.stages)
        self._closed = False
        self._threads = [threading.Thread(target=self._work, args=(k,), name=f"{name}:{s.name}:{w}", daemon=True)
                         for k, s in enumerate(self.stages) for w in range(s.workers)]
        for t in self._threads:
            t.start()

    def submit(self, payload, timeout: float | None = None) -> Future:
        """Admit one request; blocks while the pipeline is full (raises Saturated after `timeout` seconds)."""
        if self._closed:
            raise RuntimeError(f"{self.name} is closed; no new requests are accepted")
        if not self._slots.acquire(timeout=timeout):
            raise Saturated(f"{self.name}: no free slot within {timeout} s (all requests in flight)")
        job = _Job(Future(), payload)
        job.future.set_running_or_notify_cancel()
        try:
            self._put(0, job, timeout)
        except queue.Full:
            self._slots.release()
            raise Saturated(f"{self.name}: first queue still full after {timeout} s") from None
        return job.future

    def close(self, timeout: float | None = None) -> None:
        """Drain: requests already submitted finish; then every worker stops and is joined."""
        if self._closed:
            return
        self._closed = True
        for _ in range(self.stages[0].workers):
            self.queues[0].put(_STOP)
        for t in self._threads:
            t.join(timeout)

    @property
    def alive_workers(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _put(self, k: int, item, timeout: float | None = None) -> None:
        self.queues[k].put(item, timeout=timeout)  # blocks when full: the back-pressure
        with self._lock:
            self.high_water[k] = max(self.high_water[k], self.queues[k].qsize())

    def _finish(self, job: _Job, result=None, error: BaseException | None = None) -> None:
        self._slots.release()
        if error is None:
            job.future.set_result(result)
        else:
            job.future.set_exception(error)

    def _work(self, k: int) -> None:
        stage, last = self.stages[k], k == len(self.stages) - 1
        stream = torch.cuda.Stream(self.device) if self.use_streams else None
        on_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with self.grad_mode(), on_stream:  # grad mode and the current stream are per thread
            while (job := self.queues[k].get()) is not _STOP:
                try:
                    if job.ready is not None:
                        stream.wait_event(job.ready)
                        _adopt(job.payload, stream)
                    out = stage.fn(job.payload)
                    ready = None
                    if stream is not None:
                        ready = torch.cuda.Event()
                        ready.record(stream)
                        if last:
                            ready.synchronize()
                except BaseException as exc:  # the request's caller gets it; the stage goes on serving others
                    self._finish(job, error=exc)
                    continue
                if last:
                    self._finish(job, result=out)
                else:
                    self._put(k + 1, _Job(job.future, out, ready))
            self._worker_stopped(k)

    def _worker_stopped(self, k: int) -> None:
        """The last worker of a stage to stop passes the stop on, after everything it forwarded."""
        with self._lock:
            self._stopped[k] += 1
            done = self._stopped[k] == self.stages[k].workers
        if done and k + 1 < len(self.stages):
            for _ in range(self.stages[k + 1].workers):
                self.queues[k + 1].put(_STOP)
