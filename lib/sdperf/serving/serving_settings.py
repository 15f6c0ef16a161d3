"""The profile's `serving:` section, validated before any model is built (every bad key or value is named)."""
from __future__ import annotations

from dataclasses import dataclass, fields

from sdperf.core.errors import ConfigError
from sdperf.config.profiles import SCHEDULERS, Profile

DESIGNS = ("stacked", "staged")
SCENARIOS = ("Offline", "Server")


@dataclass(frozen=True)
class ServingSettings:
    designs: tuple[str, ...]  # which server designs to drive (stacked = end to end, staged = stage pipeline)
    scenarios: tuple[str, ...]  # MLPerf LoadGen scenarios to run each design in
    concurrency: tuple[int, ...]  # most requests (batches) in flight inside a design at once
    batch_sizes: tuple[int, ...]  # most LoadGen samples (images) the SUT puts in one request
    queue_depth: int  # capacity of each bounded queue between two stages
    min_duration_ms: int  # LoadGen min_duration_ms of every run
    min_query_count: int  # LoadGen min_query_count (Offline: samples in its one query, at least c x b)
    performance_samples: int  # distinct samples (seeds) in the query sample library
    server_load: float  # Server scenario: offered queries/s as a fraction of the measured single-request rate
    server_latency_factor: float  # Server target latency as a multiple of the measured single-request latency
    repeats: int  # timed repeats of the single-request calibration and of the sync-audit loops
    sync_schedulers: tuple[str, ...]  # schedulers whose denoising loop the sync audit counts


_KEYS = [f.name for f in fields(ServingSettings)]
_CHOICES = {"designs": DESIGNS, "scenarios": SCENARIOS, "sync_schedulers": SCHEDULERS}
_INT_LISTS = ("concurrency", "batch_sizes")
_INTS = ("queue_depth", "min_duration_ms", "min_query_count", "performance_samples", "repeats")
_POSITIVE_FLOATS = ("server_load", "server_latency_factor")


def _fail(profile: str, msg: str) -> ConfigError:
    return ConfigError(f"profile {profile!r}: serving.{msg}")


def _int(profile: str, key: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _fail(profile, f"{key} must be an integer >= 1, got {value!r}")
    return value


def _list(profile: str, key: str, value) -> list:
    if not isinstance(value, list) or not value:
        raise _fail(profile, f"{key} must be a non-empty list, got {value!r}")
    return value


def load(profile: Profile) -> ServingSettings:
    """The validated section; raises ConfigError naming the bad key or value and the valid choices."""
    raw, name = dict(profile.serving), profile.name
    for key in raw:
        if key not in _KEYS:
            raise _fail(name, f"{key} is not a valid key; valid keys: {', '.join(_KEYS)}")
    missing = [k for k in _KEYS if k not in raw]
    if missing:
        raise _fail(name, f"missing keys {', '.join(missing)}")
    values = {}
    for key, valid in _CHOICES.items():
        for v in _list(name, key, raw[key]):
            if v not in valid:
                raise _fail(name, f"{key} entry {v!r} is not valid; choose from: {', '.join(valid)}")
        values[key] = tuple(raw[key])
    for key in _INT_LISTS:
        values[key] = tuple(_int(name, f"{key} entry", v) for v in _list(name, key, raw[key]))
    for key in _INTS:
        values[key] = _int(name, key, raw[key])
    for key in _POSITIVE_FLOATS:
        v = raw[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise _fail(name, f"{key} must be a number > 0, got {v!r}")
        values[key] = float(v)
    return ServingSettings(**values)
