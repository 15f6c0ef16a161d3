"""08_quantization: int8 schemes (catalog keys `int8:<scheme>`) against fp32 eager by run_variants, with the int8
matmul roofs that explain them (torch's and OpenVINO's own kernels), the share of the UNet's work each scheme can
reach, and whether the int8 executor's per-step speed-up reaches its goal (a share of the int8/fp32 roof ratio)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import torch

from sdperf.config import published
from sdperf.measure.comparison import BASELINE, TWIN, Comparison, published_row, release, run_variants
from sdperf.experiments.common import interpolated, ratio_columns, rounds_method, rounds_n, with_skipped
from sdperf.measure.measurements import unet_call_inputs, unet_flops
from sdperf.optimizations import catalog, openvino_engine, quantization as opt
from sdperf.optimizations.catalog import EXECUTOR, Stack
from sdperf.optimizations.fewer_steps import unet_calls
from sdperf.store.plots import speedup_bars
from sdperf.measure.roofline import ROOF_METHOD, fit_size, matmul_peak, openvino_availability, openvino_matmul_peak
from sdperf.measure.study import Study
from sdperf.measure.timing import blocked

FP32_ROOF = "torch.mm"
# the dtype of each OpenVINO CPU-plugin GEMM roof (sdperf.measure.roofline.openvino_matmul_peak)
OPENVINO_DTYPES = {"f32": "float32", "int8": "int8", "bf16": "bfloat16"}
OV_F32, OV_INT8 = openvino_engine.ROOFS["f32"], openvino_engine.ROOFS["int8"]
# an int8 executor's per-step speed-up over fp32 eager should reach this share of OpenVINO int8 GEMM / torch.mm fp32
GOAL_SHARE = 0.8
ROOF_RATIO_METHOD = ("one process, each matmul kernel timed by torch.utils.benchmark blocked_autorange at the same "
                     "size; ratio of the two medians")
SHARE_METHOD = ("forward hooks on every nn.Linear over one UNet call, FLOPs from torch.utils.flop_counter, over the "
                "whole call's counted FLOPs")
RANDOM_WEIGHTS = ("random-init weights: the error figures describe the quantization machinery, not the quality of "
                  "a quantized Stable Diffusion")


def scheme(key: str) -> str:
    """'int8:torch-ao-dynamic' -> 'torch-ao-dynamic'; an unknown key names the valid ones."""
    tech = catalog.get(key)
    if not tech.key.startswith("int8:"):
        valid = ", ".join(catalog.keys(notebook=opt.NOTEBOOK))
        raise ValueError(f"{key!r} is not an int8 scheme; choose from: {valid}")
    return tech.key.split(":", 1)[1]


def check(keys: list[str]) -> list[str]:
    for k in keys:
        scheme(k)
    return list(keys)


def availability_table(study: Study, keys: list[str]) -> pd.DataFrame:
    rows = []
    for k in keys:
        ok, reason = opt.availability(study.device, scheme(k))
        rows.append({"key": k, "available": ok, "reason": reason, "what": opt.SCHEMES[scheme(k)].note})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------- what int8 reaches

def _linear_flops(unet, *args, **kwargs) -> tuple[int, int]:
    """(FLOPs in nn.Linear layers, number of Linear layers) of one UNet call: what Linear-only schemes touch."""
    total = [0]

    def hook(module, inputs, _out):
        tokens = inputs[0].numel() // module.in_features
        total[0] += 2 * tokens * module.in_features * module.out_features

    linears = [m for m in unet.modules() if isinstance(m, torch.nn.Linear)]
    handles = [m.register_forward_hook(hook) for m in linears]
    try:
        with torch.inference_mode():
            unet(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return total[0], len(linears)


def linear_share(study: Study) -> dict:
    """How much of one UNet call sits in nn.Linear layers: the ceiling of what a Linear-only scheme speeds up."""
    pipe = study.pipeline("float32")
    workload = study.workload(1)
    args, kwargs = unet_call_inputs(pipe, workload)
    linear, n_linear = _linear_flops(pipe.unet, *args, **kwargs)
    total = unet_flops(pipe, workload)
    counts = opt.module_counts(pipe.unet)
    out = {"unet_flops": total, "linear_flops": linear, "linear_share_percent": 100.0 * linear / total,
           "linear_layers": n_linear, "conv2d_layers": counts.get("Conv2d", 0),
           "unet_calls_per_generation": unet_calls(pipe, workload.steps)}
    pipe = None
    release()
    study.recorder.add("UNet forward, batch 1", "linear_flop_share", out["linear_share_percent"], "%", n=1, batch_size=1,
                       method=SHARE_METHOD, note=f"{linear:,} of {total:,} FLOPs in {n_linear} nn.Linear layers: the "
                                                 "part Linear-only int8 schemes quantize")
    return out


def _int_mm(device: str):
    def make(n: int):
        a = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device)
        return lambda: torch._int_mm(a, b)
    return make


def _linear_dynamic(n: int):
    layer = opt.torch_ao_dynamic(torch.nn.Sequential(torch.nn.Linear(n, n, bias=False)).eval())
    x = torch.randn(n, n)

    def run():
        with torch.inference_mode():
            layer(x)
    return run


def _openvino_roofs(study: Study, size: int) -> list[dict]:
    """OpenVINO's own CPU GEMM roofs at `size`, each with its kernel; one lacking or failing here is recorded so."""
    rows = []
    for precision, kernel in openvino_engine.ROOFS.items():
        scenario = f"matmul {size}x{size} {kernel}"
        ok, reason = ((False, f"OpenVINO's CPU plugin does not run on {study.device}") if study.device != "cpu"
                      else openvino_availability(precision))
        if not ok:
            study.recorder.not_applicable(scenario, reason, metric="peak_gops")
            continue
        try:
            roof = openvino_matmul_peak(size, precision)
        except RuntimeError as e:
            print(f"{kernel}: failed: {e}")
            study.recorder.failed(scenario, e, metric="peak_gops")
            continue
        rows.append({"kernel": kernel, "dtype": OPENVINO_DTYPES[precision], "size": size, "gops": roof.gops,
                     "n_blocks": len(roof.timing.times), "primitive": roof.primitive_type,
                     "runtime_precision": roof.runtime_precision, "note": roof.note()})
    return rows


def int8_roofs(study: Study, call_budget_s: float) -> pd.DataFrame:
    """Measured ops/s of a square matmul: fp32 torch.mm, int8 torch._int_mm (torchao's kernel), on a CPU the fbgemm
    int8 dynamic linear (torch.ao's, activation quantization included), each at the largest size up to matmul_size
    that fits `call_budget_s`, and OpenVINO's own GEMMs. `vs_fp32` is over torch.mm fp32, `vs_openvino_f32` over
    OpenVINO's f32."""
    size, device = study.profile.matmul_size, study.device
    peak, t = matmul_peak(device, torch.float32, size)
    rows = [{"kernel": FP32_ROOF, "dtype": "float32", "size": size, "gops": peak / 1e9, "n_blocks": len(t.times)}]
    kernels = [(opt.INT_MM, _int_mm(device))]
    if device == "cpu":
        kernels.append((opt.LINEAR_DYNAMIC, _linear_dynamic))
    for kernel, make in kernels:
        n = fit_size(make, size, call_budget_s, device)
        timing = blocked(make(n), device=device)
        rows.append({"kernel": kernel, "dtype": "int8", "size": n, "gops": 2 * n**3 / timing.median / 1e9,
                     "n_blocks": len(timing.times)})
    native = opt.native_int_mm(device)
    for r in rows:
        notes = []
        if r["kernel"] == opt.INT_MM:
            notes.append("cuBLASLt int8" if device == "cuda" else "oneDNN kernel (VNNI/AMX present)" if native
                         else "no AVX512-VNNI/AMX-INT8 here: PyTorch's scalar fallback loop")
        if r["size"] != size:
            notes.append(f"measured at {r['size']} (not {size}): a {size} call would exceed {call_budget_s} s")
        r["note"] = "; ".join(notes)
    df = pd.DataFrame(rows + _openvino_roofs(study, size)).reindex(
        columns=["kernel", "dtype", "size", "gops", "n_blocks", "primitive", "runtime_precision", "note"])
    df["vs_fp32"] = df["gops"] / df.loc[0, "gops"]
    ov = df.kernel.str.startswith("openvino")
    df["vs_openvino_f32"] = df["gops"].where(ov) / _gops(df, OV_F32)
    for r in df.itertuples():
        study.recorder.add(f"matmul {r.size}x{r.size} {r.kernel}", "peak_gops", r.gops, "GOP/s", n=r.n_blocks,
                           dtype=r.dtype, method=ROOF_METHOD, note=r.note)
    _record_openvino_ratio(study, df)
    return df.drop(columns="note")


def _gops(roofs: pd.DataFrame, kernel: str) -> float:
    row = roofs[roofs.kernel == kernel]
    return float(row["gops"].iloc[0]) if len(row) else float("nan")


def _record_openvino_ratio(study: Study, roofs: pd.DataFrame) -> None:
    """OpenVINO's int8-vs-f32 roof ratio as a row of its own."""
    ratio = _gops(roofs, OV_INT8) / _gops(roofs, OV_F32)
    if pd.isna(ratio):
        return
    r = roofs.set_index("kernel")
    size = int(r.loc[OV_INT8, "size"])
    study.recorder.add(f"matmul {size}x{size} openvino int8 vs f32", "roof_ratio", ratio, "x", dtype="int8",
                       method=ROOF_RATIO_METHOD, note=f"{OV_INT8} ({r.loc[OV_INT8, 'primitive']}) GOP/s over {OV_F32} "
                            f"({r.loc[OV_F32, 'primitive']}) GOP/s, each a blocked_autorange median at {size}")


def amdahl_bound(share_percent: float, roof_ratio: float) -> float:
    """Best UNet speed-up if only the Linear share ran at the int8 roof's ratio over fp32 and the rest stayed."""
    f = share_percent / 100.0
    return 1.0 / ((1.0 - f) + f / roof_ratio)


# ----------------------------------------------------------------------------------------- the comparison

def _torchao_too_slow(study: Study, share: dict, roofs: pd.DataFrame) -> str | None:
    """Why torchao is not timed whole, when its scalar _int_mm fallback alone would overrun variant_budget_s."""
    p = study.profile
    row = roofs[roofs.kernel == opt.INT_MM]
    if opt.native_int_mm(study.device) or row.empty:
        return None
    rate = float(row["gops"].iloc[0]) * 1e9
    estimate = share["linear_flops"] / rate * share["unet_calls_per_generation"] * (p.warmup + p.repeats)
    if estimate <= p.variant_budget_s:
        return None
    return (f"its int8 matmul torch._int_mm runs PyTorch's scalar fallback here (no AVX512-VNNI/AMX-INT8), "
            f"measured at {rate / 1e9:.2f} GOP/s; the UNet's Linear FLOPs alone would take about {estimate:.0f} s "
            f"for {p.warmup + p.repeats} generations, over variant_budget_s={p.variant_budget_s}; measured "
            "instead: the torch._int_mm roof above")


def compare_schemes(study: Study, keys: list[str], share: dict, roofs: pd.DataFrame) -> Comparison:
    """Each scheme against fp32 eager; torchao, when its scalar kernel would overrun the budget, as a skipped row."""
    runnable, skipped = [], []
    for k in check(keys):
        reason = _torchao_too_slow(study, share, roofs) if roof_kernel(k) == opt.INT_MM else None
        if reason and opt.availability(study.device, scheme(k))[0]:
            print(f"{k}: skipped: {reason}")
            study.recorder.skipped(f"{k}, batch 1", reason, batch_size=1)
            skipped.append({"variant": k, "key": k, "status": "skipped", "note": f"skipped: {reason}"})
        else:
            runnable.append(k)
    return with_skipped(run_variants(study, runnable), skipped)


def summary(cmp: Comparison) -> pd.DataFrame:
    """The columns a reader needs: set-up apart, each ratio with its range over rounds and its verdict."""
    cols = ["variant", "status", "setup_s", "first_call_s", "latency_s", "unet_step_s",
            *ratio_columns("speedup", "unet_step_speedup"), "peak_memory_mib", "latent_rel_error", "image_psnr_db",
            "note"]
    return cmp.table[cols]


def facts_table(cmp: Comparison) -> pd.DataFrame:
    """What each prepared UNet is made of (from the worker: module counts, warnings, engine facts)."""
    return pd.DataFrame([{"variant": k, **v} for k, v in cmp.facts.items() if k not in (BASELINE, TWIN)])


def roof_kernel(key: str) -> str | None:
    """The roof row of the precision a configuration's UNet computes in: torch.mm for fp32 eager, an executor's catalog
    roof_kernel, None where no measured roof fits (a half-precision stack)."""
    stack = Stack.of(key)
    executor = next((t for t in stack.techniques if t.family == EXECUTOR), None)
    if executor is None:
        return FP32_ROOF if stack.dtype == "float32" else None
    return executor.roof_kernel


def goal_x(roofs: pd.DataFrame) -> float:
    """The per-UNet-step goal, GOAL_SHARE of OpenVINO int8 GEMM / torch.mm fp32 (NaN where either is not measured)."""
    return GOAL_SHARE * _gops(roofs, OV_INT8) / _gops(roofs, FP32_ROOF)


def _goal(r, goal: float) -> dict:
    """Whether a row's per-step speed-up reaches `goal`: its median, and every round (its min)."""
    return {"goal_x": goal, "unet_step_speedup": r.unet_step_speedup, "unet_step_speedup_lo": r.unet_step_speedup_lo,
            "unet_step_speedup_hi": r.unet_step_speedup_hi, "goal_met": bool(r.unet_step_speedup >= goal),
            "goal_met_every_round": bool(r.unet_step_speedup_lo >= goal)}


def _met(goal_met: bool, every_round: bool) -> str:
    return ("reached in every round" if every_round else "reached by the median, not in every round" if goal_met
            else "not reached")


def _record_goal(study: Study, r, row: dict, roofs: pd.DataFrame) -> None:
    met = _met(row["goal_met"], row["goal_met_every_round"])
    how = (f"issue 15: {GOAL_SHARE} x ({OV_INT8} {_gops(roofs, OV_INT8):.1f} / {FP32_ROOF} fp32 "
           f"{_gops(roofs, FP32_ROOF):.1f} GOP/s, blocked_autorange medians)")
    g, common = row["goal_x"], dict(scenario=f"{r.variant}, batch 1", dtype="int8", key=r.key, batch_size=1)
    study.recorder.add_many([
        dict(common, metric="unet_step_speedup_goal", value=g, unit="x",
             method=f"a target, not a measurement: {GOAL_SHARE} x the int8/fp32 matmul roof ratio "
                    f"({ROOF_RATIO_METHOD})",
             note=f"{how}; measured {r.unet_step_speedup:.2f}x [{r.unet_step_speedup_lo:.2f}-"
                  f"{r.unet_step_speedup_hi:.2f}] over rounds: {met}"),
        dict(common, metric="percent_of_unet_step_goal", value=100 * r.unet_step_speedup / g, unit="%",
             lo=100 * r.unet_step_speedup_lo / g, hi=100 * r.unet_step_speedup_hi / g, n=int(r.rounds), method=r.method,
             note=f"per-step speed-up over fp32 eager (median [min-max] over rounds) of the goal {g:.2f}x; {met}")])


def roofline(study: Study, cmp: Comparison, share: dict, roofs: pd.DataFrame) -> pd.DataFrame:
    """Achieved ops/s of each configuration as a share of its precision's roof and of torch.mm fp32's, the Amdahl
    ceiling of the Linear-only schemes, and each int8-computing executor's per-step goal and whether it is met."""
    roof = roofs.set_index("kernel")
    fp32, goal = _gops(roofs, FP32_ROOF), goal_x(roofs)
    rows = []
    for r in cmp.ok().itertuples():
        achieved = share["unet_flops"] / r.unet_step_s / 1e9
        row = {"variant": r.variant, "unet_step_s": r.unet_step_s, "achieved_gops": achieved,
               "percent_of_fp32_roof": 100 * achieved / fp32}
        kernel = roof_kernel(r.key)
        if kernel in roof.index:
            k = roof.loc[kernel]
            row.update(roof_kernel=kernel, roof_dtype=k["dtype"], roof_gops=k["gops"],
                       percent_of_roof=100 * achieved / k["gops"])
            primitive = f" ({k['primitive']})" if isinstance(k.get("primitive"), str) else ""
            study.recorder.add(f"{r.variant}, batch 1", "percent_of_roof", row["percent_of_roof"], "%",
                               dtype=k["dtype"], key=r.key, method=r.method,
                               note=f"UNet ops / median UNet call over rounds, of the measured {kernel}{primitive} "
                                    f"roof {k['gops']:.1f} GOP/s at {int(k['size'])} (blocked_autorange median; "
                                    "every op counted, whatever precision it runs in)")
            if r.key.startswith("int8:") and opt.SCHEMES[scheme(r.key)].linear_only:
                row["linear_only_ceiling_x"] = amdahl_bound(share["linear_share_percent"], k["gops"] / fp32)
            if k["dtype"] == "int8" and pd.notna(goal):
                row.update(_goal(r, goal))
                _record_goal(study, r, row, roofs)
        rows.append(row)
    return pd.DataFrame(rows)


def goal_summary(line: pd.DataFrame) -> str:
    """One sentence per int8-computing executor of roofline()'s table: its per-step speed-up against the goal."""
    if "goal_x" not in line or line["goal_x"].isna().all():
        return "no goal: OpenVINO's int8 roof or an int8 executor was not measured here"
    out = []
    for r in line[line["goal_x"].notna()].itertuples():
        out.append(f"{r.variant}: {r.unet_step_speedup:.2f}x per UNet step ({r.unet_step_speedup_lo:.2f}-"
                   f"{r.unet_step_speedup_hi:.2f}x over rounds) against the goal {r.goal_x:.2f}x: "
                   f"{_met(r.goal_met, r.goal_met_every_round)}")
    return "\n".join(out)


def verdicts(cmp: Comparison) -> pd.DataFrame:
    """Speed and drift of each measured scheme in one line, with what random weights make of the error figures."""
    ok = cmp.ok()
    ok = ok[~ok.variant.str.startswith(BASELINE)]
    out = ok[["variant", "speedup", "speedup_lo", "speedup_hi", "speedup_verdict", "unet_step_speedup",
              "unet_step_speedup_verdict", "latent_rel_error", "image_psnr_db", "verdict"]].copy()
    out["caveat"] = RANDOM_WEIGHTS
    return out.reset_index(drop=True)


# published int8 figure -> the scheme measured here that is the same technique, and what each side is
LIKE_FOR_LIKE = (
    ("dynamic int8 of the Linear layers (torchao), over the compiled bf16 pipeline below it",
     ("int8:torchao-int8-dynamic", "int8:torch-ao-dynamic"),
     "dynamic int8 of the Linear layers, as published (convolutions stay fp32); lossless within the study's budget "
     "or not is in 12"),
    ("OpenVINO 8-bit by quantization-aware training (NNCF), over PyTorch fp32",
     ("int8:openvino-nncf-ptq",),
     "post-training static int8 (NNCF, calibrated on captions), weights and activations, convolutions included: "
     "lossy, and not the published technique (theirs was retrained; the post says post-training int8 did not hold "
     "quality for their UNet)"),
)


def _published_int8() -> list[dict]:
    """The two published int8 figures (sdperf.config.published.compared), in LIKE_FOR_LIKE's order."""
    t = published.compared().set_index("measured_key")
    return [dict(source=f"{r.source} ({r.url})", hardware=r.hardware, conditions=r.settings, figure=float(r.value),
                 detail=r.detail) for r in (t.loc[keys[0]] for _, keys, _ in LIKE_FOR_LIKE)]


def published_vs_measured(study: Study, cmp: Comparison) -> pd.DataFrame:
    """Each published int8 figure beside the same technique here (LIKE_FOR_LIKE), never the fastest scheme."""
    ok = cmp.ok().set_index("key")
    rows = []
    for (claim, keys, what), pub in zip(LIKE_FOR_LIKE, _published_int8()):
        key = next((k for k in keys if k in ok.index), None)
        measured, cond = None, f"not measured here: none of {', '.join(keys)} ran in this comparison"
        if key is not None:
            b = ok.loc[key]
            measured = float(b["speedup"])
            cond = (f"{study.conditions(1)}; {key}: {what}; vs fp32 eager, range {b['speedup_lo']:.2f}-"
                    f"{b['speedup_hi']:.2f}x over rounds, {b['speedup_verdict']}; {cmp.method}")
        rows.append(published_row(claim, pub["source"], pub["hardware"], pub["conditions"], pub["figure"],
                                  measured, cond, detail=pub["detail"]))
    return pd.DataFrame(rows)


def plot(study: Study, cmp: Comparison):
    """Speed-up over fp32 eager (PSNR on the bars) and the latent error of each scheme."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    drawn = cmp.table[cmp.table.variant != TWIN]
    speedup_bars(drawn, f"int8 vs fp32 eager ({study.device}); bars: min-max over rounds", ax=left)
    ok = cmp.ok()
    ok = ok[~ok.variant.str.startswith(BASELINE)]
    right.bar(ok["variant"], ok["latent_rel_error"], color=plt.cm.tab10.colors[:len(ok)])
    right.set(ylabel="latent relative error", yscale="log", title="drift from fp32 (random weights)")
    plt.setp(right.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")
    study.save_figure(fig, "int8_speedup_drift",
                      what="int8 schemes: speed-up per image at the profile's steps (left; median, bars: min-max over "
                      "rounds, label: PSNR vs fp32) and the relative error of each scheme's final latents against "
                      "fp32's from the same initial latents (right; random weights: drift, not quality)",
                      baseline=interpolated(BASELINE) + "; drift: the fp32 eager output of the same seed",
                      method=rounds_method(cmp, drawn) + "; drift from each configuration's round-0 output",
                      n=rounds_n(study, drawn) + "; drift: one generation per configuration")
    return fig
