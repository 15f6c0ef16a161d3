"""04_torch_compile: inductor's modes, freezing, regional compilation, channels_last and other backends (catalog
keys `compile:<spec>`) against fp32 eager by run_variants; what compiling costs with a cold cache (round 0) and
a warm one (later rounds: a new process, the inductor cache on disk); how many recompiles a new shape causes."""
from __future__ import annotations

import pandas as pd
import torch
from torch._inductor.utils import clear_caches

from sdperf.config import published
from sdperf.config.architectures import get as get_arch, vae_scale_factor
from sdperf.measure.comparison import BASELINE, TWIN, Comparison, published_row, run_variants
from sdperf.experiments.common import interpolated, ratio_columns, rounds_method, rounds_n
from sdperf.measure.drift import relative_error
from sdperf.model.generation import Workload, encode
from sdperf.optimizations import torch_compile as tc
from sdperf.optimizations.catalog import Context, Stack
from sdperf.core.paths import scratch_dir
from sdperf.store.plots import speedup_bars
from sdperf.measure.study import Study


# --- caches ------------------------------------------------------------------------------------------------
def forget_compiled() -> None:
    """Dynamo's compiled code and inductor's in-memory caches gone, for the in-process experiments below."""
    torch._dynamo.reset()
    clear_caches()


def cuda_graph_modes_here(study: Study) -> pd.DataFrame:
    """Each CUDA-graph mode on this device, on the UNet's timestep embedding (compiles in seconds): does it run, how
    often did inductor skip CUDA graphs, does the output match eager."""
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


# --- availability and the comparison ----------------------------------------------------------------------
def availability_table(study: Study, keys: list[str]) -> pd.DataFrame:
    ctx = Context(study.profile)
    return pd.DataFrame([{"variant": k, **dict(zip(("available", "reason"), Stack.of(k).availability(ctx)))}
                         for k in keys])


def run(study: Study, keys: list[str], cold: bool = True) -> tuple[Comparison, pd.DataFrame]:
    """Every key against fp32 eager, then what compiling cost. `cold`: empty the workers' inductor cache first, so
    round 0's first configuration compiles cold (later ones share its kernels, as on one host) and later rounds warm."""
    for k in keys:
        if not k.startswith("compile:"):
            raise ValueError(f"{k!r} is not a torch.compile key; give compile:<spec>, e.g. compile:freezing")
    if cold:
        tc.clear_inductor(scratch_dir(study.profile.name))
    cmp = run_variants(study, keys)
    return cmp, compile_table(study, cmp)


def summary(cmp: Comparison) -> pd.DataFrame:
    """The comparison's columns a reader needs, the drift (~1e-6) in e-notation."""
    cols = ["variant", "status", "first_call_s", "first_call_warm_s", "latency_s", "unet_step_s",
            *ratio_columns("speedup", "unet_step_speedup"), "peak_memory_mib", "latent_rel_error", "image_psnr_db",
            "note"]
    out = cmp.table[cols].copy()
    out["latent_rel_error"] = [f"{v:.1e}" if pd.notna(v) else "" for v in out["latent_rel_error"]]
    return out


def _round_facts(cmp: Comparison, name: str) -> tuple[dict, dict]:
    """(round 0's compile facts: cold cache, the last round's: warm cache) of one configuration."""
    raw = cmp.measured.raw
    mine = raw[(raw.config == name) & (raw.status == "ok")].sort_values("round")
    facts = [f for f in mine.get("facts", []) if isinstance(f, dict)]
    return (facts[0] if facts else {}), (facts[-1] if len(facts) > 1 else {})


def compile_table(study: Study, cmp: Comparison) -> pd.DataFrame:
    """Per compiled configuration, round 0 (cold inductor cache, unless an earlier configuration filled it) against
    later rounds (the cache on disk): compile seconds, first call, cache hits, graphs, breaks, skips, recompiles."""
    rows, rec = [], []
    for r in cmp.table.itertuples():
        if not str(r.key).startswith("compile:"):
            continue
        cold, warm = _round_facts(cmp, r.variant)
        if r.status != "ok" or "compile_s" not in cold:
            if r.status != "ok":
                rows.append({"variant": r.variant, "status": r.status, "failure": r.note})
            continue
        row = {"variant": r.variant, "status": r.status, "compile_s": cold["compile_s"],
               "compile_warm_s": warm.get("compile_s"), "first_call_s": r.first_call_s,
               "first_call_warm_s": r.first_call_warm_s, "first_call_excess_s": r.first_call_s - r.latency_s,
               "fx_graph_cache_hits": cold["fx_graph_cache_hits"],
               "fx_graph_cache_misses": cold["fx_graph_cache_misses"],
               "fx_graph_cache_hits_warm": warm.get("fx_graph_cache_hits"), "graphs_compiled": cold["graphs_compiled"],
               "graph_breaks": cold["graph_breaks"], "cudagraph_skips": cold["cudagraph_skips"],
               "recompiles": len(cold["recompile_reasons"]), "failure": "; ".join(cold["failures"])}
        rows.append(row)
        scenario, common = f"{r.variant}, batch 1", dict(n=1, dtype="float32", key=r.key, method=cmp.method)
        skip = (f"; inductor skipped CUDA graphs {row['cudagraph_skips']}x (CPU-only graph: silently, a counter only)"
                if row["cudagraph_skips"] else "")
        rec += [dict(scenario=scenario, metric="compile", value=row["compile_s"], unit="s",
                     note=f"Dynamo + backend compile in the first call, round 0 (inductor cache emptied before the "
                          f"run, shared by the configurations); fx graph cache hits {row['fx_graph_cache_hits']}, "
                          f"misses {row['fx_graph_cache_misses']}", **common),
                dict(scenario=scenario, metric="graphs_compiled", value=row["graphs_compiled"], unit="graphs",
                     note=f"graph breaks {row['graph_breaks']}{skip}", **common)]
        if warm:
            rec.append(dict(scenario=scenario, metric="compile_warm", value=warm["compile_s"], unit="s",
                            note=f"last round: a new process, inductor cache on disk; fx graph cache hits "
                                 f"{warm['fx_graph_cache_hits']}, misses {warm['fx_graph_cache_misses']}", **common))
    if rec:
        study.recorder.add_many(rec)
    return pd.DataFrame(rows)


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


EXPLAIN_METHOD = "torch._dynamo.explain over one UNet call at the profile's shape (no backend compiles)"
RECOMPILE_METHOD = ("one torch.compile'd UNet called at each shape in turn (shape_sequence); graphs compiled per call "
                    "from torch's compile log, summed")


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
    common = dict(scenario="UNet, torch._dynamo.explain", n=1, method=EXPLAIN_METHOD)
    study.recorder.add_many([
        dict(common, metric="graph_breaks", value=ex.graph_break_count, unit="breaks",
             note="; ".join(out["break_reasons"])[:300]),
        dict(common, metric="graphs", value=ex.graph_count, unit="graphs", note=f"{ex.op_count} ops captured")])
    return out


def shape_sequence(study: Study) -> list[tuple[str, int, int]]:
    """(what changes, batch size, resolution): the profile's shape, a new batch, two resolutions 8 latent pixels
    smaller each (every SD UNet accepts them), and the first shape again."""
    p = study.profile
    step = 8 * vae_scale_factor(p.arch)
    return [("profile's shape", 1, p.resolution), ("new batch size", 2, p.resolution),
            ("new resolution", 1, p.resolution - step), ("another resolution", 1, p.resolution - 2 * step),
            ("profile's shape again", 1, p.resolution)]


def _call(unet, args, kwargs, log) -> str:
    """One UNet call with its compile records into `log`; the error line if it raised, else ''."""
    try:
        with tc.compile_log(log), torch.inference_mode():
            unet(*args, **kwargs)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
    return ""


def recompiles(study: Study, settings: list[str], backend: str = "eager") -> pd.DataFrame:
    """Graphs Dynamo compiles at each shape of shape_sequence, per dynamic-shape setting. Dynamo's guards decide
    before any backend runs, so a cheap backend counts inductor's recompiles (but for inductor's own shape guards
    under dynamic shapes: backend='inductor' counts those too, at a full compile each)."""
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
             value=int(g.graphs_compiled.sum()), unit="graphs", n=len(g), method=RECOMPILE_METHOD,
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
# claim, source, published config before -> after, and the (variant, reference) pairs that answer it: the first
# that ran is used (reference None: fp32 eager)
CLAIMS = [
    ("torch.compile vs eager", "diffusers docs torch2.0", "SDPA eager", "SDPA + torch.compile",
     [("compile:default", None)]),
    ("torch.compile vs eager", "fal-ai stable-diffusion-benchmarks", "SDPA fp16", "SDPA + torch.compile",
     [("compile:default", None)]),
    ("torch.compile vs eager, with freezing (this CPU's set-up)", "diffusers docs torch2.0", "SDPA eager",
     "SDPA + torch.compile", [("compile:freezing", None)]),
    ("channels_last on top of torch.compile", "fal-ai stable-diffusion-benchmarks", "SDPA + torch.compile",
     "SDPA + torch.compile + channels_last", [("compile:channels_last+default", "compile:default"),
                                              ("compile:channels_last+freezing", "compile:freezing")]),
    ("torch.compile max-autotune vs eager", "stable-fast README", "vanilla", "torch.compile max-autotune",
     [("compile:max-autotune", None), ("compile:max-autotune-no-cudagraphs", None),
      ("compile:max-autotune-no-cudagraphs+freezing", None)]),
]


def _measured(cmp: Comparison, pairs) -> tuple[float | None, str]:
    """The first measured (key, reference) pair's per-UNet-step ratio, with its range against fp32 eager."""
    t = cmp.table.set_index("variant")
    ran = set(t.index[t.status == "ok"])
    for key, ref in pairs:
        if key in ran and (ref is None or ref in ran):
            r = t.loc[key]
            if ref is None:
                return float(r.unet_step_speedup), (
                    f"'{key}' vs '{BASELINE}', {r.unet_step_speedup_lo:.2f}-{r.unet_step_speedup_hi:.2f}x over "
                    f"rounds, {r.unet_step_speedup_verdict}; {cmp.method}")
            return float(t.loc[ref, "unet_step_s"] / r.unet_step_s), (
                f"'{key}' vs '{ref}': ratio of their medians over rounds (no per-round range); {cmp.method}")
    return None, f"not run: add {' or '.join(repr(p[0]) for p in pairs)} to variants"


def published_vs_measured(study: Study, cmp: Comparison) -> pd.DataFrame:
    """Published it/s ratios beside the per-UNet-step ratio measured here."""
    rows = []
    for claim, source, before, after, pairs in CLAIMS:
        a = published.select(source, what=before, model="SD 1.5").iloc[0]
        b = published.select(source, what=after, model="SD 1.5").iloc[0]
        measured, which = _measured(cmp, pairs)
        rows.append(published_row(
            claim, published.cite(source), a["hardware"], a["settings"],
            float(b["value"]) / float(a["value"]), measured, study.conditions(scope=f"UNet step, {which}"),
            detail=f"{a['value']} -> {b['value']} {a['unit']}"))
    return pd.DataFrame(rows)


def plot(study: Study, cmp: Comparison, compiles: pd.DataFrame):
    """Speed-up per configuration (min-max over rounds), and compile seconds cold (round 0) and warm."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    drawn = cmp.table[cmp.table.variant != TWIN]
    speedup_bars(drawn, f"torch.compile set-ups vs fp32 eager ({study.profile.name}, {study.device})", ax=left)
    ok = compiles[compiles.status == "ok"] if len(compiles) else compiles
    if len(ok):
        y = range(len(ok))
        right.barh([i + 0.2 for i in y], ok["compile_s"], height=0.4, color="grey", label="round 0 (cold cache)")
        right.barh([i - 0.2 for i in y], ok["compile_warm_s"].fillna(0), height=0.4, color="tab:blue",
                   label="later rounds (cache on disk)")
        right.set_yticks(list(y), ok["variant"])
        right.set(xlabel="compile in the first call (s)", title="what compiling cost")
        right.legend(fontsize=8)
    study.save_figure(fig, "speedup_and_compile",
                      what="torch.compile set-ups: speed-up per image at the profile's steps (left; median, bars: "
                      "min-max over rounds, label: PSNR vs fp32) and the compile time inside the first call, round "
                      "0 with cold caches beside the median of later rounds with the cache on disk (right)",
                      baseline=interpolated(BASELINE) + " (compile: absolute seconds)",
                      method=rounds_method(cmp, drawn), n=rounds_n(study, drawn))
    return fig
