"""04_torch_compile: inductor's modes, freezing, regional compilation, channels_last and other backends against
fp32 eager; what compiling costs with a cold and a warm cache; how many recompiles a new shape causes."""
from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial

import pandas as pd
import torch
from torch._inductor.utils import clear_caches

from sdperf import published
from sdperf.architectures import get as get_arch
from sdperf.architectures import vae_scale_factor
from sdperf.comparison import BASELINE, Comparison, Variant, published_row, release, run_variants
from sdperf.drift import relative_error
from sdperf.generation import Workload, encode, generate
from sdperf.optimizations import half_precision
from sdperf.optimizations import torch_compile as tc
from sdperf.pipelines import build_pipeline
from sdperf.plots import speedup_bars
from sdperf.profiles import load_profile
from sdperf.study import Study

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
COLD = "empty (cold)"


# --- caches ------------------------------------------------------------------------------------------------
def empty_cache() -> str:
    """Point inductor at a new, empty cache folder and drop its in-memory caches: the next compile is cold.
    (torch._inductor.utils.fresh_cache does this as a context manager; compilation is lazy, so here the
    setting has to outlive the call that makes it.)"""
    clear_caches()
    os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="sdperf-inductor-")
    atexit.register(shutil.rmtree, os.environ[CACHE_ENV], ignore_errors=True)  # gone with the notebook's kernel
    return os.environ[CACHE_ENV]


def forget_compiled() -> None:
    """Dynamo's compiled code and inductor's in-memory caches gone, the cache folder kept."""
    torch._dynamo.reset()
    clear_caches()


def prepared(pipe, spec: str, dtype: str):
    """The pipeline in the profile's precision (GPU profiles: the half precision the published figures used),
    its UNet set up as `spec` says."""
    if dtype != "float32":
        pipe = half_precision.apply(pipe, dtype)
    return tc.apply(pipe, spec)


def cuda_graph_modes_here(study: Study) -> pd.DataFrame:
    """What torch does with each CUDA-graph mode on this device, shown on the UNet's timestep embedding (a real
    piece of the profile's architecture that compiles in seconds): does it run, how often did inductor skip
    CUDA graphs, and does the output match eager."""
    from diffusers.models.embeddings import TimestepEmbedding

    width = get_arch(study.profile.arch).unet["block_out_channels"][0]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(study.profile.seed)
        module = TimestepEmbedding(width, 4 * width).eval().to(study.device)
        x = torch.randn(2, width, device=study.device)
    rows = []
    for mode in tc.CUDA_GRAPH_MODES:
        forget_compiled()
        log, row = tc.CompileLog(), {"mode": mode, "device": study.device}
        try:
            with torch.inference_mode(), tc.compile_log(log):
                ref = module(x)
                compiled = torch.compile(module, mode=mode)
                outs = [compiled(x).clone() for _ in range(3)]  # CUDA graphs record on the first calls, then replay
            row.update(ran=True, matches_eager=all(relative_error(o.cpu(), ref.cpu()) < 1e-4 for o in outs))
        except Exception as exc:  # what torch does includes refusing
            row.update(ran=False, error=f"{type(exc).__name__}: {exc}"[:200])
        rows.append({**row, "cudagraph_skips": log.cudagraph_skips})
    forget_compiled()
    return pd.DataFrame(rows)


# --- availability and the variants -------------------------------------------------------------------------
def availability_table(study: Study, specs: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"variant": s, **dict(zip(("available", "reason"), tc.availability(study.device, s)))}
                         for s in specs])


def _prepare(pipe, spec: str, dtype: str, fresh: bool, records: dict):
    forget_compiled()  # no compiled code of an earlier variant can serve this one
    if fresh:
        empty_cache()
    pipe = prepared(pipe, spec, dtype)
    # keep the compile log and the cache folder, not the model (its memory goes back after the variant)
    records[spec] = {"log": getattr(pipe.unet, "log", None), "cache_dir": os.environ.get(CACHE_ENV), "fresh": fresh}
    return pipe


def make_variants(study: Study, specs: list[str], cold_compile_each: bool, records: dict) -> list[Variant]:
    """One Variant per spec. The first compiled one compiles into an empty inductor cache; the later ones share
    that cache (kernels an earlier variant compiled are reused) unless `cold_compile_each`."""
    out, first, dtype = [], True, study.profile.dtype
    for spec in specs:
        ok, reason = tc.availability(study.device, spec)
        compiled = ok and tc.parse(spec).compiled
        out.append(Variant(label=spec, availability=(ok, reason), note=reason, dtype=dtype,
                           apply=partial(_prepare, spec=spec, dtype=dtype, records=records,
                                         fresh=compiled and (first or cold_compile_each))))
        first = first and not compiled
    return out


def run(study: Study, specs: list[str], cold_compile_each: bool = False) -> tuple[Comparison, pd.DataFrame, dict]:
    """Every spec against fp32 eager (run_variants), then what compiling each one cost."""
    records: dict[str, dict] = {}
    cmp = run_variants(study, make_variants(study, specs, cold_compile_each, records))
    return cmp, compile_table(study, cmp, records), records


def summary(cmp: Comparison) -> pd.DataFrame:
    """The comparison's columns a reader needs: times and ratios rounded, the drift (~1e-6) in e-notation."""
    cols = ["variant", "status", "first_call_s", "latency_s", "p10_s", "p90_s", "unet_step_s", "speedup",
            "speedup_lo", "speedup_hi", "unet_step_speedup", "peak_memory_mib", "latent_rel_error",
            "image_psnr_db", "note"]
    out = cmp.table[cols].round({c: 3 for c in cols[2:12]} | {"image_psnr_db": 1})
    out["latent_rel_error"] = [f"{v:.1e}" if pd.notna(v) else "" for v in out["latent_rel_error"]]
    return out


def _failure(log) -> str:
    """The failing compile record's error and the innermost frame it was raised in."""
    for r in (log.records if log else []):
        if r.fail_type:
            frames = re.findall(r'File "(?:[^"]*site-packages/)?([^"]+)", line (\d+), in (\S+)',
                                "\n".join(r.exception_stack_trace or []))
            where = f" (raised in {frames[-1][0]}:{frames[-1][1]} {frames[-1][2]})" if frames else ""
            return f"{r.fail_type}: {r.fail_reason}{where}"
    return ""


def compile_table(study: Study, cmp: Comparison, records: dict) -> pd.DataFrame:
    """Per compiled variant: Dynamo + backend compile seconds, graphs, cache hits, CUDA-graph skips, the first
    call's excess over a steady one, and for a failure where it broke; the figures also go to results.csv."""
    rows = []
    t = cmp.table.set_index("variant")
    for spec, rec in records.items():
        if rec["log"] is None:
            continue
        f = tc.compile_facts(rec["log"])
        ok = t.loc[spec, "status"] == "ok"
        cache = COLD if rec["fresh"] else "shared with the variants before"
        rows.append({"variant": spec, "status": t.loc[spec, "status"], "inductor_cache": cache,
                     "compile_s": f["compile_s"], "first_call_s": t.loc[spec, "first_call_s"],
                     "first_call_excess_s": t.loc[spec, "first_call_s"] - t.loc[spec, "latency_s"] if ok else None,
                     "graphs_compiled": f["graphs_compiled"], "graph_breaks": f["graph_breaks"],
                     "fx_graph_cache_hits": f["fx_graph_cache_hits"],
                     "fx_graph_cache_misses": f["fx_graph_cache_misses"], "cudagraph_skips": f["cudagraph_skips"],
                     "recompiles": len(f["recompile_reasons"]), "failure": _failure(rec["log"])})
        if not ok:
            continue
        scenario = f"{spec}, batch 1"
        skip = (f"; inductor skipped CUDA graphs {f['cudagraph_skips']}x (CPU-only graph: silently, a counter only)"
                if f["cudagraph_skips"] else "")
        study.recorder.add_many([
            dict(scenario=scenario, metric="compile", value=f["compile_s"], unit="s", n=1, dtype=study.profile.dtype,
                 note=f"Dynamo + backend compile in the first call(s) (torch compile records); inductor cache "
                      f"{cache}; fx graph cache hits {f['fx_graph_cache_hits']}, misses {f['fx_graph_cache_misses']}"),
            dict(scenario=scenario, metric="graphs_compiled", value=f["graphs_compiled"], unit="graphs", n=1,
                 dtype=study.profile.dtype, note=f"graph breaks {f['graph_breaks']}{skip}"),
        ])
    return pd.DataFrame(rows)


# --- cold vs warm cache ------------------------------------------------------------------------------------
def _first_call(pipe, workload) -> dict:
    """Time one generation from a freshly set-up UNet and read its compile records."""
    t0 = time.perf_counter()
    generate(pipe, workload)
    first = time.perf_counter() - t0
    f = tc.compile_facts(pipe.unet.log)
    return {"compile_s": f["compile_s"], "first_call_s": first, "fx_graph_cache_hits": f["fx_graph_cache_hits"],
            "fx_graph_cache_misses": f["fx_graph_cache_misses"]}


def warm_compile(profile: str, spec: str, cache_dir: str) -> dict:
    """Compile `spec` against a cache folder another run filled (what a restarted server pays)."""
    os.environ[CACHE_ENV] = cache_dir
    forget_compiled()
    prof = load_profile(profile)
    pipe = prepared(build_pipeline(prof), spec, prof.dtype)
    return _first_call(pipe, Workload.from_profile(prof, 1))


def warm_compile_in_new_process(profile: str, spec: str, cache_dir: str) -> dict:
    """The honest warm figure: a new Python process, nothing in memory, only the cache folder on disk."""
    cmd = [sys.executable, "-m", "sdperf.experiments.torch_compile", "warm-compile", "--profile", profile,
           "--spec", spec, "--cache-dir", cache_dir]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"warm-compile process exited {done.returncode}: "
                           + " | ".join(done.stderr.strip().splitlines()[-3:]))
    return json.loads(done.stdout.strip().splitlines()[-1])


def cold_vs_warm(study: Study, compiles: pd.DataFrame, records: dict, new_process: bool = True) -> pd.DataFrame:
    """The first variant that compiled into an empty cache (cold), compiled again from the same cache folder:
    in this process after forgetting everything in memory, and (optionally) in a new Python process."""
    cold = compiles[(compiles.inductor_cache == COLD) & (compiles.status == "ok")] if len(compiles) else compiles
    if cold.empty:
        raise ValueError("no compiled variant ran into an empty cache; put a compiled variant in `variants`")
    row = cold.iloc[0]
    spec, cache_dir = row.variant, records[row.variant]["cache_dir"]
    rows = [{"variant": spec, "cache": "cold: empty folder, this process", "compile_s": row.compile_s,
             "first_call_s": row.first_call_s, "fx_graph_cache_hits": row.fx_graph_cache_hits,
             "fx_graph_cache_misses": row.fx_graph_cache_misses}]
    forget_compiled()
    os.environ[CACHE_ENV] = cache_dir
    pipe = prepared(study.pipeline("float32"), spec, study.profile.dtype)
    rows.append({"variant": spec, "cache": "warm: same folder, this process after torch._dynamo.reset()",
                 **_first_call(pipe, study.workload(1))})
    pipe = None
    release()
    if new_process:
        where = "warm: same folder, a new Python process"
        try:
            rows.append({"variant": spec, "cache": where,
                         **warm_compile_in_new_process(study.profile.name, spec, cache_dir)})
        except Exception as exc:  # recorded, the notebook goes on
            study.recorder.failed(f"{spec}, {where}", exc, metric="compile")
            rows.append({"variant": spec, "cache": where, "note": f"failed: {exc}"})
    df = pd.DataFrame(rows)
    study.recorder.add_many([
        dict(scenario=f"{spec}, {r.cache}", metric="compile", value=r.compile_s, unit="s", n=1,
             dtype=study.profile.dtype, note=f"Dynamo + backend compile (torch compile records); first generation "
             f"{r.first_call_s:.2f} s; fx graph cache hits {r.fx_graph_cache_hits}, misses {r.fx_graph_cache_misses}")
        for r in df.itertuples() if pd.notna(r.compile_s)])
    return df


# --- graph breaks and recompiles ---------------------------------------------------------------------------
def unet_inputs(study: Study, pipe, batch_size: int, resolution: int) -> tuple[tuple, dict]:
    """What the loop passes the UNet at this batch size and resolution (the classifier-free guidance batch)."""
    w = Workload(**{**study.workload(batch_size).__dict__, "height": resolution, "width": resolution})
    device = next(pipe.unet.parameters()).device
    with torch.inference_mode():
        embeds, extra = encode(pipe, w, device)
    scale = pipe.vae_scale_factor
    gen = torch.Generator("cpu").manual_seed(study.profile.seed)
    x = torch.randn(2 * batch_size, pipe.unet.config.in_channels, resolution // scale, resolution // scale,
                    generator=gen).to(device)
    return (x, torch.tensor(999, device=device)), {"encoder_hidden_states": embeds, "return_dict": False, **extra}


def graph_breaks(study: Study) -> dict:
    """Does Dynamo capture the UNet as one graph (what fullgraph=True requires)? torch._dynamo.explain."""
    pipe = study.pipeline("float32")
    args, kwargs = unet_inputs(study, pipe, 1, study.profile.resolution)
    forget_compiled()
    with torch.inference_mode():
        ex = torch._dynamo.explain(pipe.unet)(*args, **kwargs)
    forget_compiled()
    out = {"graphs": ex.graph_count, "graph_breaks": ex.graph_break_count, "ops_captured": ex.op_count,
           "break_reasons": [str(b.reason) for b in ex.break_reasons]}
    scenario = "UNet, torch._dynamo.explain"
    study.recorder.add_many([
        dict(scenario=scenario, metric="graph_breaks", value=ex.graph_break_count, unit="breaks", n=1,
             note="; ".join(out["break_reasons"])[:300]),
        dict(scenario=scenario, metric="graphs", value=ex.graph_count, unit="graphs", n=1,
             note=f"{ex.op_count} ops captured"),
    ])
    return out


def shape_sequence(study: Study) -> list[tuple[str, int, int]]:
    """(what changes, batch size, resolution): the profile's shape, a new batch size, two smaller resolutions
    (8 latent pixels apart, which every SD UNet accepts), and the first shape again."""
    p = study.profile
    step = 8 * vae_scale_factor(p.arch)
    return [("profile's shape", 1, p.resolution), ("new batch size", 2, p.resolution),
            ("new resolution", 1, p.resolution - step), ("another resolution", 1, p.resolution - 2 * step),
            ("profile's shape again", 1, p.resolution)]


def _call(unet, args, kwargs, log) -> str:
    """One UNet call with its compile records into `log`; the error line if it raised (e.g. a dimension marked
    dynamic that the model specializes), else ''."""
    try:
        with tc.compile_log(log), torch.inference_mode():
            unet(*args, **kwargs)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
    return ""


def recompiles(study: Study, settings: list[str], backend: str = "eager") -> pd.DataFrame:
    """Graphs Dynamo compiles at each shape of shape_sequence, per dynamic-shape setting. Whether a call
    recompiles is decided by Dynamo's guards before any backend runs, so a cheap backend counts the recompiles
    inductor would do (inductor can add shape guards of its own under dynamic shapes: pass backend='inductor'
    to count with it, at the price of a full compile each)."""
    bad = [s for s in settings if s not in tc.DYNAMIC_SETTINGS]
    if bad:
        raise ValueError(f"recompile settings {bad} are not valid; choose from: {', '.join(tc.DYNAMIC_SETTINGS)}")
    pipe = study.pipeline("float32")
    shapes = [(what, b, res, unet_inputs(study, pipe, b, res)) for what, b, res in shape_sequence(study)]
    rows = []
    for setting in settings:
        forget_compiled()
        unet = torch.compile(pipe.unet, backend=backend, dynamic=tc.DYNAMIC_SETTINGS[setting])
        for i, (what, b, res, (args, kwargs)) in enumerate(shapes):
            if setting == "mark_dynamic" and i == 0:  # batch and spatial dims of the latents, batch of the text
                torch._dynamo.mark_dynamic(args[0], [0, 2, 3])
                torch._dynamo.mark_dynamic(kwargs["encoder_hidden_states"], 0)
            log = tc.CompileLog()
            error = _call(unet, args, kwargs, log)
            f = tc.compile_facts(log)
            rows.append({"setting": setting, "call": i + 1, "change": what, "batch_size": b, "resolution": res,
                         "graphs_compiled": f["graphs_compiled"],
                         "reason": "; ".join(r.strip() for r in f["recompile_reasons"])[:200], "error": error})
            if error:
                break
    forget_compiled()
    df = pd.DataFrame(rows)
    study.recorder.add_many([
        dict(scenario=f"UNet, dynamic setting {setting}, backend {backend}", metric="graphs_compiled",
             value=int(g.graphs_compiled.sum()), unit="graphs", n=len(g),
             note=" -> ".join(f"{r.change} (batch {r.batch_size}, {r.resolution}px): {r.graphs_compiled}"
                              + (f" [{r.error}]" if r.error else "") for r in g.itertuples())[:500])
        for setting, g in df.groupby("setting", sort=False)])
    return df


def recompile_counts(df: pd.DataFrame) -> str:
    """Graphs compiled per call and setting, with what each call changed: a text table."""
    counts = df.pivot(index="setting", columns="call", values="graphs_compiled").loc[df.setting.unique()]
    calls = df[["call", "change", "batch_size", "resolution"]].drop_duplicates("call")
    return counts.to_string() + "\n\n" + calls.to_string(index=False)


# --- published vs measured, plot ---------------------------------------------------------------------------
# claim, source, published config before -> after (its SD 1.5 rows), and the (variant, reference) pairs measured
# here that answer it: the first pair that ran is used (reference None: the fp32 eager baseline)
CLAIMS = [
    ("torch.compile vs eager", "diffusers docs torch2.0", "SDPA eager", "SDPA + torch.compile",
     [("default", None)]),
    ("torch.compile vs eager", "fal-ai stable-diffusion-benchmarks", "SDPA fp16", "SDPA + torch.compile",
     [("default", None)]),
    ("torch.compile vs eager, with freezing (this CPU's set-up)", "diffusers docs torch2.0", "SDPA eager",
     "SDPA + torch.compile", [("freezing", None)]),
    ("channels_last on top of torch.compile", "fal-ai stable-diffusion-benchmarks", "SDPA + torch.compile",
     "SDPA + torch.compile + channels_last", [("channels_last+default", "default"),
                                              ("channels_last+freezing", "freezing")]),
    ("torch.compile max-autotune vs eager", "stable-fast README", "vanilla", "torch.compile max-autotune",
     [("max-autotune", None), ("max-autotune-no-cudagraphs", None), ("max-autotune-no-cudagraphs+freezing", None)]),
]


def _measured(table: pd.DataFrame, pairs) -> tuple[float | None, str]:
    """Ratio of median UNet steps for the first (variant, reference) pair that was measured."""
    t = table.set_index("variant")
    ran = set(t.index[t.status == "ok"])
    for spec, ref in pairs:
        if spec in ran and (ref is None or ref in ran):
            base = t.loc[ref or BASELINE, "unet_step_s"]
            return float(base / t.loc[spec, "unet_step_s"]), f"'{spec}' vs '{ref or BASELINE}'"
    return None, f"not run: add {' or '.join(repr(p[0]) for p in pairs)} to variants"


def published_vs_measured(study: Study, table: pd.DataFrame) -> pd.DataFrame:
    """Published it/s ratios beside the ratio of median UNet steps measured here."""
    rows = []
    for claim, source, before, after, pairs in CLAIMS:
        a = published.select(source, config=before, model="SD 1.5").iloc[0]
        b = published.select(source, config=after, model="SD 1.5").iloc[0]
        measured, which = _measured(table, pairs)
        rows.append(published_row(
            claim, source, a["hardware"], f"{a['model']}, {a['resolution']}px, batch {a['batch_size']}",
            float(b["value"]) / float(a["value"]), measured, study.conditions(scope=f"UNet step, {which}"),
            detail=f"{a['value']} -> {b['value']} {a['unit']}"))
    return pd.DataFrame(rows)


def plot(study: Study, table: pd.DataFrame, compiles: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    speedup_bars(table, f"torch.compile set-ups vs fp32 eager ({study.profile.name}, {study.device})", ax=left)
    ok = compiles[compiles.status == "ok"] if len(compiles) else compiles
    if len(ok):
        right.barh(ok["variant"], ok["compile_s"], color="grey")
        right.set(xlabel="compile in the first call (s)", title="what compiling cost")
    study.save_figure(fig, "speedup_and_compile")
    return fig


# --- the warm-cache process --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sdperf.experiments.torch_compile")
    ap.add_argument("command", choices=["warm-compile"])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--cache-dir", required=True)
    a = ap.parse_args(argv)
    print(json.dumps(warm_compile(a.profile, a.spec, a.cache_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
