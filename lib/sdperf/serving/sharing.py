"""A paper estimate of GPU sharing (MIG, time-sharing, MPS; the seed's GKE strategies) from measured figures.

None of the three can be set up from a notebook (MIG needs an administrator, MPS a control daemon, time-sharing a
device plugin), so every figure here is arithmetic on the measured single-request latency, labelled "estimate (not
measured)". What decides all three is `busy`, the fraction of the device one request keeps busy: per-image time at a
batch over the batch-1 latency (if 4 images cost 4 times one, sharing adds no throughput), or `measured_busy` from
elsewhere (13 reads 00_baseline's batch rows); without a batched measurement it is 1, and the table says so.
"""
from __future__ import annotations

import pandas as pd

LABEL = "estimate (not measured)"
MIG_SEVENTHS = {1: 7, 2: 3, 3: 2, 7: 1}  # instances -> compute sevenths each (7x1g, 3x2g, 2x3g, 1x7g on A100/H100)
MIG_MEMORY_EIGHTHS = {7: 8, 3: 4, 2: 4, 1: 1}  # compute sevenths -> memory eighths of the GPU (7g.80gb, 3g.40gb...)


def busy_fraction(single_latency_s: float, batch_latency_s: float | None = None, batch_size: int | None = None):
    """(fraction of the device one request keeps busy, how it was obtained)."""
    if batch_latency_s is None or not batch_size or batch_size < 2:
        return 1.0, "assumed 1.0: no batched latency measured, so no evidence of idle capacity"
    busy = min(1.0, batch_latency_s / batch_size / single_latency_s)
    return busy, f"per-image time at batch {batch_size} / batch-1 latency (measured)"


def estimate(single_latency_s: float, *, batch_latency_s: float | None = None, batch_size: int | None = None,
             peak_memory_mib: float | None = None, device_memory_mib: float | None = None,
             clients: tuple[int, ...] = (1, 2, 3, 7), measured_busy: tuple[float, str] | None = None) -> pd.DataFrame:
    """Per strategy and number of clients: latency per request, aggregate images/s, memory needed; all estimates.
    `measured_busy`: (fraction, how it was measured) from elsewhere, used instead of the batch given here."""
    busy, how = measured_busy or busy_fraction(single_latency_s, batch_latency_s, batch_size)
    rows = []
    for n in clients:  # n clients, each with one request at a time: throughput = n / latency (Little's law)
        rows.append(_row("MPS", n, 1.0, single_latency_s * max(1.0, n * busy), n, single_latency_s,
                         "kernels of all clients run side by side until the device is full",
                         peak_memory_mib, device_memory_mib))
        rows.append(_row("time-sharing", n, 1.0, single_latency_s * n, n, single_latency_s,
                         "round robin of whole time slices, idle SMs inside a slice stay idle; context-switch "
                         "cost not included (a lower bound)", peak_memory_mib, device_memory_mib))
        if n in MIG_SEVENTHS:
            share = MIG_SEVENTHS[n] / 7
            memory = None if device_memory_mib is None else device_memory_mib * MIG_MEMORY_EIGHTHS[MIG_SEVENTHS[n]] / 8
            rows.append(_row("MIG", n, share, single_latency_s * max(1.0, busy / share), 1, single_latency_s,
                             f"{n} instance(s) of {MIG_SEVENTHS[n]}/7 of the SMs each; a request slows down only "
                             "when its share is below the busy fraction", peak_memory_mib, memory))
    table = pd.DataFrame(rows)
    table["busy_fraction"] = busy
    table["busy_fraction_from"] = how
    table["label"] = LABEL
    return table


def _row(strategy, n, share, latency_s, copies, single_latency_s, assumption, peak_mib, memory_mib) -> dict:
    """One estimate; `copies` model copies (one per process, or one per MIG instance) must fit in `memory_mib`."""
    need = None if peak_mib is None else peak_mib * copies
    fits = None if need is None or memory_mib is None else bool(need <= memory_mib)
    return {"strategy": strategy, "clients": n, "compute_share_each": share, "est_latency_s": latency_s,
            "est_throughput_img_s": n / latency_s, "est_throughput_vs_one_client": n * single_latency_s / latency_s,
            "memory_needed_mib": need, "memory_available_mib": memory_mib, "fits": fits, "assumption": assumption}
