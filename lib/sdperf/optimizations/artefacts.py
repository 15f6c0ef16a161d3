"""Exported engine artefacts kept on disk between the worker processes of a run, and across runs.

Every configuration runs in a fresh process in every round (sdperf.measure.rounds), so without a cache each round would
export SD 1.5's UNet again (tens of seconds, 3.4 GB of ONNX). Each comparison gets a folder of its own
(Context.artefacts, made and removed by comparison.run_variants); the first worker builds an artefact into a
folder named by what determines it (engine, exporter, input shapes, the library versions and a digest of the
UNet's weights), and later workers load it. The folder appears under its final name only once complete (built
under a temporary name, then renamed), so a killed build never leaves a half-written engine that a later worker
would load. Set-up time then reads "built" in the first round and "loaded" in the others: the worker reports
both (rounds.summarize: setup_s of the first round, setup_warm_s of the later ones).

Across runs. An artefact is pure in what names it (engine, exporter, shapes, library versions, weights), so a later
run on the same machine loads it instead of building it again (an NNCF post-training quantization of SD 1.5's UNet
took 4-5 minutes per build on cpu). `sdperf run` keeps one shared folder per profile (shared_root) of at most
CACHE_ENV GiB (default DEFAULT_CACHE_GIB; 0 turns it off: each comparison then builds into a folder of its own,
removed after it), evicting the least recently used artefacts. What came from an earlier run says so (origin): its
row's note names the run that built it and that build's time, which is the set-up time a fresh machine pays.
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch

from sdperf.core.environment import package_versions

DONE = "artefact.json"
PACKAGES = ("torch", "onnx", "onnxscript", "onnxruntime", "openvino", "nncf")
CACHE_ENV = "SDPERF_ENGINE_CACHE_GIB"
PLUGIN_CACHE = "openvino-model-cache"  # OpenVINO's compiled-model cache beside the IRs (openvino_engine.ir_model)
DEFAULT_CACHE_GIB = 24.0  # the cpu study's engines of SD 1.5 (fp32 IR and ONNX 3.4 GB each, int8 ~1 GB) with room


def cache_gib() -> float:
    """The cross-run cache's size cap in GiB (CACHE_ENV; 0: no cache across runs)."""
    from sdperf.core.errors import ConfigError

    raw = os.environ.get(CACHE_ENV, "")
    try:
        gib = float(raw) if raw.strip() else DEFAULT_CACHE_GIB
    except ValueError:
        raise ConfigError(f"{CACHE_ENV}={raw!r} is not a number of GiB (0 turns the engine cache off)") from None
    if not math.isfinite(gib) or gib < 0:
        raise ConfigError(f"{CACHE_ENV}={raw!r} must be a finite number of GiB >= 0, e.g. 24 (0 turns the engine "
                          "cache off)")
    return gib


def shared_root(scratch: Path) -> Path:
    """The profile's engine folder that outlives a run."""
    return Path(scratch) / "engines" / "shared"


def root_for(scratch: Path, owner: str) -> tuple[Path, bool]:
    """(folder a comparison builds its engines in, whether it is the shared cross-run one): shared unless the cache
    is turned off, else a folder of `owner`'s own (cleared by release)."""
    import uuid

    if cache_gib() > 0:
        return shared_root(scratch), True
    return Path(scratch) / "engines" / f"{owner}-{uuid.uuid4().hex[:8]}", False


def release(root: Path, shared: bool) -> list[str]:
    """After a comparison: trim the shared cache to its cap (least recently used first), or clear a private
    folder. Returns the artefacts evicted."""
    if not shared:
        clear(root)
        return []
    return trim(root, int(cache_gib() * 2**30))


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _ours(entry: Path) -> bool:
    """An artefact folder cached() wrote: named '<kind>-<16 hex>' (cache_key), a real folder holding a DONE record
    of a build (built_by), so a user's folder that happens to hold an artefact.json is never a unit to evict."""
    if entry.is_symlink() or not entry.is_dir() or not _KEY.fullmatch(entry.name) or not (entry / DONE).is_file():
        return False
    try:
        return "built_by" in json.loads((entry / DONE).read_text())
    except (OSError, ValueError, TypeError):
        return False


_KEY = re.compile(r"[a-z0-9][a-z0-9_.-]*-[0-9a-f]{16}")


def trim(root: Path, cap_bytes: int) -> list[str]:
    """Evict complete artefacts, least recently used first (DONE's mtime: touched on every load), until the folder
    holds at most `cap_bytes`; what cached() set aside as damaged goes first, whatever the cap. Unfinished builds
    (no DONE) are another worker's, never touched here; nothing is
    evicted through a link or outside the reports folder (paths.removable warns instead), and only what cached()
    and OpenVINO's plugin cache wrote is a unit."""
    from sdperf.core.paths import removable
    from sdperf.store import verified

    root = Path(root)
    if not root.is_dir() or not removable(root):
        return []
    # units: what was set aside as damaged (first), complete artefacts (by their DONE) and the OpenVINO plugin's
    # compiled blobs (each file its own)
    aside = root / verified.QUARANTINE
    first = [q for q in aside.iterdir() if not q.is_symlink()] if aside.is_dir() and not aside.is_symlink() else []
    for q in first:
        shutil.rmtree(q, ignore_errors=True) if q.is_dir() else q.unlink(missing_ok=True)
    gone = [f"{verified.QUARANTINE}/{q.name}" for q in first]
    units = {d: d / DONE for d in root.iterdir() if _ours(d)}
    plugin = root / PLUGIN_CACHE
    if plugin.is_dir() and not plugin.is_symlink():
        units.update({f: f for f in plugin.glob("*") if f.is_file() and not f.is_symlink()
                      and f.name != verified.FOLDER_SEAL})
    order = sorted(units, key=lambda u: units[u].stat().st_mtime)
    sizes = {u: _size(u) if u.is_dir() else u.stat().st_size for u in order}
    total = sum(sizes.values())
    for u in order:
        if total <= cap_bytes:
            break
        shutil.rmtree(u, ignore_errors=True) if u.is_dir() else u.unlink(missing_ok=True)
        total -= sizes[u]
        gone.append(u.name)
    return gone


def earlier_run(facts: dict) -> str | None:
    """The run that built this artefact when it was not this one (a load from the cross-run cache), else None."""
    from sdperf.core import environment

    by = facts.get("built_by")
    return by if by and by != environment.run_id() else None


def origin(facts: dict, hit: bool, made: str = "converted") -> str:
    """What a row's note says of its artefact: built now, loaded from this run's cache, or from an earlier run's
    (with that run and its build time: the set-up a fresh machine pays)."""
    if not hit:
        return f"{made} into the run's cache" + (f" ({facts['rebuilt']})" if facts.get("rebuilt") else "")
    by = earlier_run(facts)
    if by:
        took = facts.get("export_s")
        return (f"loaded from the cache of an earlier run ({by}"
                + (f"; its build took {float(took):.0f} s" if isinstance(took, (int, float)) else "") + ")")
    return "loaded from the run's cache"


def weights_digest(module: torch.nn.Module) -> str:
    """sha256 over every tensor's name, shape, dtype and bytes: equal weights give equal digests, any other weights
    a different one. One pass over the bytes (1.95 s for SD 1.5's UNet on the 2-core EPYC, where sums and sums of
    squares in float64 took 4.7 s), paid by every worker that looks up an engine."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in module.state_dict().items():
            if not isinstance(t, torch.Tensor):  # extra state: its text says what it is
                h.update(f"{name}|{t!r}".encode())
                continue
            h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()[:16]


def cache_key(kind: str, module: torch.nn.Module, **what) -> str:
    """The folder name of an artefact: its kind and a hash of everything that determines its content."""
    spec = json.dumps({"kind": kind, "weights": weights_digest(module), "versions": package_versions(PACKAGES), **what},
                      sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(spec.encode()).hexdigest()[:16]}"


def cached(root: Path | str, key: str, build: Callable[[Path], dict]) -> tuple[Path, dict, bool]:
    """(folder, facts, hit): the complete artefact `key` under `root`, built by `build(folder) -> facts` when
    absent. A build that raises leaves nothing behind. Every file of a built artefact is sealed with its digest
    (sdperf.store.verified) and checked before the artefact is used: one that fails (a weight changed in place,
    a truncated file, an unreadable DONE record, a file added) is set aside and built again, and the new facts
    say why under `rebuilt`."""
    from sdperf.core import environment
    from sdperf.store import verified

    root = Path(root)
    final = root / key
    rebuilt = None
    if (final / DONE).is_file() and not final.is_symlink():
        rebuilt = verified.check_folder(final)
        if rebuilt is None:
            try:
                facts = json.loads((final / DONE).read_text())
            except (OSError, ValueError) as exc:
                rebuilt = f"its {DONE} cannot be read ({exc})"
            else:
                os.utime(final / DONE)  # used now: the last to be evicted (trim)
                return final, facts, True
        verified.quarantine(final, rebuilt)
    elif final.is_symlink():
        final.unlink()  # an artefact is built here, never linked in: the link goes, its target stays
    else:
        shutil.rmtree(final, ignore_errors=True)  # not ours to trust: only complete folders carry DONE
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    try:
        facts = dict(build(tmp), built_by=environment.run_id(),
                     **({"rebuilt": f"the cached artefact was set aside: {rebuilt}"} if rebuilt else {}))
        (tmp / DONE).write_text(json.dumps(facts, default=str))
        verified.seal_folder(tmp)
        try:
            os.replace(tmp, final)
        except OSError:  # another worker finished the same artefact first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
            return final, json.loads((final / DONE).read_text()), True
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        full = _disk_full(root, exc)
        if full is not None:
            raise OSError(errno.ENOSPC, f"building the engine {key} failed: {full} ({type(exc).__name__}: "
                                        f"{str(exc)[:200]}); free space there or set {CACHE_ENV}=0") from exc
        raise
    return final, facts, False


LOW_DISK_BYTES = 1 << 30  # a build that fails with less than this free beside it is said to have met a full disk


def _disk_full(root: Path, exc: BaseException) -> str | None:
    """Why a failed build met a full disk, in words, else None: OpenVINO's serializer says only `basic_ios::clear:
    iostream error` when its write fails, so the free space is read instead of the message."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"the disk holding {str(root)!r} is full"
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return None
    if free < LOW_DISK_BYTES:
        return f"the disk holding {str(root)!r} has {free / 2**20:,.0f} MiB free"
    return None


def clear(root: Path | str) -> None:
    """Drop the folder of one comparison's engines (not reused by the next comparison: its shapes may differ,
    and SD 1.5 engines are gigabytes each). Each comparison has a folder of its own, so clearing one never
    pulls an engine from under another comparison running at the same time."""
    shutil.rmtree(Path(root), ignore_errors=True)
