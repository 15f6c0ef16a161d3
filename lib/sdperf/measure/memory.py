"""Will a configuration fit in this machine's memory? Its worker's peak, estimated before anything is built, against
the memory available now: one that cannot fit is a `skipped` row naming both, not a kernel the OOM killer takes.

The estimate, every part an allowance: fp32 weights (a worker builds the fp32 pipeline first), activations from the
resolution and batch, the technique's extra copies of networks (Technique.extra_copies), and the runtime. The latest
process peak results.csv holds for the same key, batch, machine, commit and setting replaces it, held within
TRUSTED_BAND of the formula so that one outlier row can neither hide a real need nor skip the configuration for good.
The memory available is the least of MemAvailable, the room under a cgroup limit and SDPERF_MEMORY_CAP_MIB.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from sdperf.config.architectures import ARCHS, PUBLISHED_PARAMETERS
from sdperf.core.errors import ConfigError

CAP_ENV = "SDPERF_MEMORY_CAP_MIB"
MIB = 2**20
BYTES = {"float32": 4}
RUNTIME_BYTES = 600 * MIB  # the libraries a worker imports before it builds anything (an allowance)
ACT_BYTES = 4  # activations counted as fp32, the worst case
CGROUP_ROOT = Path("/sys/fs/cgroup")


# ---------------------------------------------------------------- what is available

@dataclass(frozen=True)
class Available:
    """Memory a new worker may use, in bytes, and where that figure comes from."""

    bytes: int
    source: str

    @property
    def mib(self) -> float:
        return self.bytes / MIB


def meminfo_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_dirs() -> list[Path]:
    """This process's cgroup v2 folder and its parents up to the root (each may carry a memory limit)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    rel = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
    if rel is None:
        return []
    here = CGROUP_ROOT / rel.lstrip("/")
    return [here, *[p for p in here.parents if CGROUP_ROOT in (p, *p.parents)]]


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def cgroup_room() -> tuple[int, str] | None:
    """The room left under the tightest cgroup (v2 or v1) memory limit above this process, or None when unset."""
    rooms = []
    for d in _cgroup_dirs():
        limit, used = _read_int(d / "memory.max"), _read_int(d / "memory.current")
        if limit is not None and used is not None:
            rooms.append((limit - used, f"cgroup {d} memory.max {limit / MIB:,.0f} MiB, in use {used / MIB:,.0f} MiB"))
    v1 = CGROUP_ROOT / "memory"
    limit, used = _read_int(v1 / "memory.limit_in_bytes"), _read_int(v1 / "memory.usage_in_bytes")
    if limit is not None and used is not None and limit < 2**60:  # v1 says "no limit" with a huge number
        rooms.append((limit - used, f"cgroup v1 limit {limit / MIB:,.0f} MiB, in use {used / MIB:,.0f} MiB"))
    return min(rooms) if rooms else None


def cap_bytes() -> int | None:
    """SDPERF_MEMORY_CAP_MIB in bytes, or None when unset; anything but a positive integer is refused by name."""
    raw = os.environ.get(CAP_ENV, "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:  # isdigit alone passes '²', which int() refuses
        raise ConfigError(f"{CAP_ENV}={raw!r} is not valid: set it to a positive whole number of MiB (e.g. 8192), "
                          "or unset it to use the memory available")
    return int(raw) * MIB


def available() -> Available:
    """The least of MemAvailable, the room under a cgroup limit and SDPERF_MEMORY_CAP_MIB, naming which it is."""
    mem, room, cap = meminfo_available(), cgroup_room(), cap_bytes()
    found = [] if mem is None else [(mem, "MemAvailable in /proc/meminfo")]
    found += [] if room is None else [room]
    found += [] if cap is None else [(cap, f"{CAP_ENV}={cap // MIB}")]
    if not found:  # no /proc (not Linux): physical memory is the only ceiling known
        found.append((os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"))
    b, source = min(found)
    return Available(max(int(b), 0), source)


# ---------------------------------------------------------------- the estimate

@functools.lru_cache(maxsize=None)
def parameter_counts(arch: str) -> dict[str, int]:
    """Parameters per network of `arch`, allocating nothing: the published counts, else a meta-device count."""
    if arch in PUBLISHED_PARAMETERS:
        return dict(PUBLISHED_PARAMETERS[arch])
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    a = ARCHS[arch]
    with torch.device("meta"):
        nets = {"unet": UNet2DConditionModel(**a.unet), "vae": AutoencoderKL(**a.vae),
                "text_encoder": CLIPTextModel(CLIPTextConfig(**a.text_encoder))}
        if a.text_encoder_2 is not None:
            nets["text_encoder_2"] = CLIPTextModelWithProjection(CLIPTextConfig(**a.text_encoder_2))
    return {k: sum(p.numel() for p in m.parameters()) for k, m in nets.items()}


def _heads(unet: dict, level: int) -> int:
    """diffusers' `attention_head_dim` of the SD UNets is the number of heads (its historical name)."""
    h = unet.get("attention_head_dim", 8)
    return int(h[level] if isinstance(h, (list, tuple)) else h)


def unet_activation_bytes(arch: str, resolution: int, unet_batch: int) -> int:
    """Self-attention scores (tokens^2 per head) at the first cross-attention level, plus each level's feature maps
    kept for the skip connections (layers_per_block + 1 per level, down and up)."""
    a = ARCHS[arch]
    u, latent = a.unet, resolution // a.vae_scale_factor
    level = next((i for i, t in enumerate(u["down_block_types"]) if "CrossAttn" in t), None)
    scores = 0
    if level is not None:
        tokens = (latent // 2**level) ** 2
        scores = unet_batch * _heads(u, level) * tokens * tokens * ACT_BYTES
    maps = sum(2 * (u["layers_per_block"] + 1) * c * (latent // 2**i) ** 2
               for i, c in enumerate(u["block_out_channels"])) * unet_batch * ACT_BYTES
    return scores + maps


def vae_activation_bytes(arch: str, resolution: int, batch: int) -> int:
    """Per image: four full-resolution feature maps and the mid-block attention over the latent's pixels."""
    a = ARCHS[arch]
    latent = resolution // a.vae_scale_factor
    channels = a.vae["block_out_channels"][min(1, len(a.vae["block_out_channels"]) - 1)]
    maps = 4 * channels * resolution * resolution * ACT_BYTES
    attention = latent**4 * ACT_BYTES
    return (maps + attention) * batch


def _extra_copies(stack) -> dict[str, int]:
    """Extra copies of each network the stack's techniques hold; the largest where two overlap."""
    copies: dict[str, int] = {}
    for t in stack.techniques:
        for n, k in t.extra_copies.items():
            copies[n] = max(copies.get(n, 0), k)
    return copies


@dataclass(frozen=True)
class Estimate:
    """A configuration's estimated peak in bytes, its parts, and its basis (the formula or earlier rows)."""

    bytes: int
    parts: dict
    basis: str

    @property
    def mib(self) -> float:
        return self.bytes / MIB

    def text(self) -> str:
        parts = ", ".join(f"{k} {v / MIB:,.0f}" for k, v in self.parts.items())
        return f"estimated peak {self.mib:,.0f} MiB ({self.basis}; {parts} MiB)"


def formula(profile, stack_key: str, batch_size: int) -> Estimate:
    """The estimate from the architecture, resolution, batch and technique alone (see the module's docstring)."""
    from sdperf.optimizations.catalog import Stack

    stack = Stack.of(stack_key)
    counts = parameter_counts(profile.arch)
    weights = sum(counts.values()) * BYTES["float32"]
    if profile.device != "cpu":  # the host builds the fp32 pipeline; activations and engines live on the GPU
        parts = {"weights": weights, "runtime": RUNTIME_BYTES}
        return Estimate(sum(parts.values()), parts, "formula, host memory only: fp32 weights + runtime")
    unet_batch = batch_size * (2 if profile.guidance_scale > 1 else 1)
    acts = unet_activation_bytes(profile.arch, profile.resolution, unet_batch) \
        + vae_activation_bytes(profile.arch, profile.resolution, batch_size)
    extra = sum(counts.get(n, 0) * k for n, k in _extra_copies(stack).items()) * BYTES["float32"]
    parts = {"weights": weights, "activations": acts, "technique": extra, "runtime": RUNTIME_BYTES}
    return Estimate(sum(parts.values()), parts, "formula: fp32 weights + activations + technique + runtime")


TRUSTED_BAND = (0.6, 1.5)  # the share of the formula a measured peak may move the estimate to


@functools.lru_cache(maxsize=8)
def _peaks(path: str, mtime_ns: int) -> dict:
    """{(key, batch, machine, commit, setting): latest process peak MiB} of one results.csv, read once per mtime."""
    import pandas as pd

    from sdperf.store.results import read_table

    try:
        df = read_table(Path(path))
    except Exception:  # noqa: BLE001 - an unreadable table only means no refinement
        return {}
    df = df[(df.metric == "process_peak_memory") & (df.status == "ok")]
    if "setting" not in df:
        return {}
    df = df.assign(top=pd.concat([pd.to_numeric(df.value, errors="coerce"),  # hi: the largest worker's
                                  pd.to_numeric(df.hi, errors="coerce")], axis=1).max(axis=1))
    df = df[df.batch_size.notna() & df.top.notna() & df.setting.notna()].sort_values("time_utc", kind="stable")
    return {(key, int(b), machine, commit, setting): float(top)
            for key, b, machine, commit, setting, top in zip(df.key, df.batch_size, df.machine, df.commit,
                                                               df.setting, df.top)}


def measured_peak_mib(profile, stack_key: str, batch_size: int, machine: str, commit: str) -> float | None:
    """The latest process peak results.csv holds for this configuration, batch, machine, commit and setting."""
    from sdperf.store.results import results_path

    path = results_path(profile.name)
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return None
    return _peaks(str(path), mtime).get((stack_key, batch_size, machine, commit, profile.setting))


def estimate(profile, stack_key: str = "fp32-eager", batch_size: int = 1) -> Estimate:
    """The formula, refined by the configuration's latest measured peak within TRUSTED_BAND (module docstring)."""
    from sdperf.core import environment

    est = formula(profile, stack_key, batch_size)
    seen = measured_peak_mib(profile, stack_key, batch_size, environment.fingerprint(profile.device),
                             environment.git_commit())
    if seen is None:
        return est
    low, high = (share * est.bytes for share in TRUSTED_BAND)
    used = int(min(max(seen * MIB, low), high))
    basis = "the latest process peak of this configuration in results.csv (same setting, machine and commit)"
    if used != int(seen * MIB):
        basis += (f", measured {seen:,.0f} MiB, held to {TRUSTED_BAND[0]:g}-{TRUSTED_BAND[1]:g}x the formula "
                  "(a peak outside that band is more likely a stray row than the configuration's)")
    return Estimate(used, {"measured": int(seen * MIB), "formula": est.bytes}, basis)


def preflight(profile, stack_key: str = "fp32-eager", batch_size: int = 1,
              room: Available | None = None) -> tuple[bool, str]:
    """(fits, why): whether the configuration's estimate fits the memory available, and a sentence naming both."""
    est = estimate(profile, stack_key, batch_size)
    room = room or available()
    where = f"{room.mib:,.0f} MiB available ({room.source})"
    if est.bytes > room.bytes:
        return False, (f"skipped: not enough memory for {stack_key} at batch {batch_size}: {est.text()} exceeds "
                       f"the {where}")
    return True, f"{est.text()} fits the {where}"


class NotEnoughMemory(RuntimeError):
    """A pipeline this process was about to build cannot fit the memory available (estimate and room named)."""


def require(profile, what: str, stack_key: str = "fp32-eager", batch_size: int = 1) -> None:
    """Raise NotEnoughMemory when `what` cannot fit: a clear error instead of a kernel killed for memory."""
    fits, why = preflight(profile, stack_key, batch_size)
    if not fits:
        raise NotEnoughMemory(f"{what}: {why.removeprefix('skipped: ')}; free memory (close other processes) or set "
                              "a smaller resolution or batch in the profile")
