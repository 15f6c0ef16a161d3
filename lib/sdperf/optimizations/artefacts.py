"""Exported engine artefacts kept on disk between the worker processes of a run, and across runs.

Every configuration runs in a fresh process in every round, so without a cache each round would export the UNet
again. The first worker builds an artefact into a folder named by what determines it (engine, exporter, shapes,
library versions, a digest of the weights), under a temporary name renamed once complete, and later workers load it.

Across runs: `sdperf run` keeps one shared folder per profile (shared_root) of at most CACHE_ENV GiB (default
DEFAULT_CACHE_GIB; 0: each comparison builds into a folder of its own, removed after it), evicting the least
recently used artefacts. A row's note names the earlier run that built its artefact and that build's time (origin).
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
    """(folder a comparison builds its engines in, whether it is the shared one): else one of `owner`'s own."""
    import uuid

    if cache_gib() > 0:
        return shared_root(scratch), True
    return Path(scratch) / "engines" / f"{owner}-{uuid.uuid4().hex[:8]}", False


def release(root: Path, shared: bool) -> list[str]:
    """After a comparison: trim the shared cache to its cap, or clear a private folder; the artefacts evicted."""
    if not shared:
        clear(root)
        return []
    return trim(root, int(cache_gib() * 2**30))


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _ours(entry: Path) -> bool:
    """An artefact folder cached() wrote: named '<kind>-<16 hex>' (cache_key), a real folder whose DONE record names
    its build (built_by), so a user's folder holding an artefact.json is never evicted."""
    if entry.is_symlink() or not entry.is_dir() or not _KEY.fullmatch(entry.name) or not (entry / DONE).is_file():
        return False
    try:
        return "built_by" in json.loads((entry / DONE).read_text())
    except (OSError, ValueError, TypeError):
        return False


_KEY = re.compile(r"[a-z0-9][a-z0-9_.-]*-[0-9a-f]{16}")


def trim(root: Path, cap_bytes: int) -> list[str]:
    """Evict complete artefacts, least recently used first (DONE's mtime), until the folder holds at most
    `cap_bytes`; what cached() set aside as damaged goes first, whatever the cap. Unfinished builds (no DONE) are
    never touched, nor anything through a link or outside the reports folder (paths.removable)."""
    from sdperf.core.paths import removable
    from sdperf.store import verified

    root = Path(root)
    if not root.is_dir() or not removable(root):
        return []
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
    """What a row's note says of its artefact: built now, loaded from this run's cache, or from an earlier run's."""
    if not hit:
        return f"{made} into the run's cache" + (f" ({facts['rebuilt']})" if facts.get("rebuilt") else "")
    by = earlier_run(facts)
    if by:
        took = facts.get("export_s")
        return (f"loaded from the cache of an earlier run ({by}"
                + (f"; its build took {float(took):.0f} s" if isinstance(took, (int, float)) else "") + ")")
    return "loaded from the run's cache"


def weights_digest(module: torch.nn.Module) -> str:
    """sha256 over every tensor's name, shape, dtype and bytes: equal weights give equal digests."""
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
    absent; a build that raises leaves nothing behind. Every file is sealed (sdperf.store.verified) and checked
    before use: an artefact that fails is set aside and built again, its new facts saying why under `rebuilt`."""
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
    """Why a failed build met a full disk, else None (OpenVINO's failed write says only `iostream error`)."""
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
    """Drop the folder of one comparison's engines (its own, so no other comparison's engine goes with it)."""
    shutil.rmtree(Path(root), ignore_errors=True)
