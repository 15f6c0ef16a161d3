"""08_quantization: int8 schemes (catalog keys `int8:<scheme>`) against fp32 eager by run_variants (each in
fresh processes, in rounds, beside the fp32 twin that gives the noise floor), with the int8 matmul roofs that
explain them and the share of the UNet's work each scheme can reach (measured here, not ratios to fp32)."""
from __future__ import annotations


import matplotlib.pyplot as plt
import pandas as pd
import torch

from sdperf import published
from sdperf.comparison import BASELINE, TWIN, Comparison, published_row, release, run_variants
from sdperf.measurements import unet_call_inputs, unet_flops
from sdperf.optimizations import catalog
from sdperf.optimizations import quantization as opt
from sdperf.optimizations.fewer_steps import unet_calls
from sdperf.plots import speedup_bars
from sdperf.roofline import fit_size, matmul_peak
from sdperf.study import Study
from sdperf.timing import blocked

LINEAR_ONLY = ("torch-ao-dynamic", "torchao-int8-dynamic")
# Which measured int8 kernel each scheme's matmuls run on (OpenVINO's own kernels are not timed alone; the
# fbgemm int8 linear is the closest measured int8 roof for them).
ROOF_KERNEL = {"torch-ao-dynamic": "quantized linear_dynamic", "torchao-int8-dynamic": "torch._int_mm",
               "openvino-nncf-weights": "quantized linear_dynamic", "openvino-nncf-ptq": "quantized linear_dynamic"}
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
        rows.append({"key": k, "available": ok, "reason": reason, "what": opt.SCHEMES[scheme(k)]})
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
    """How much of one UNet call (batch 1, guidance batch 2) sits in nn.Linear layers: the ceiling of what a
    Linear-only scheme can speed up (Amdahl)."""
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
    study.recorder.add("UNet forward, batch 1", "linear_flop_share", out["linear_share_percent"], "%", n=1,
                       note=f"{linear:,} of {total:,} FLOPs in {n_linear} nn.Linear layers (forward hooks / "
                            "torch.utils.flop_counter): the part Linear-only int8 schemes quantize")
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


def int8_roofs(study: Study, call_budget_s: float) -> pd.DataFrame:
    """Measured ops/s of a square matmul: fp32 torch.mm, int8 torch._int_mm (torchao's kernel) and, on a CPU,
    the fbgemm int8 dynamic linear (torch.ao's kernel, activation quantization included), each at the largest
    size up to the profile's matmul_size that fits `call_budget_s` per call."""
    size, device = study.profile.matmul_size, study.device
    peak, t = matmul_peak(device, torch.float32, size)
    rows = [{"kernel": "torch.mm", "dtype": "float32", "size": size, "gops": peak / 1e9, "n_blocks": len(t.times)}]
    kernels = [("torch._int_mm", _int_mm(device))]
    if device == "cpu":
        kernels.append(("quantized linear_dynamic", _linear_dynamic))
    for kernel, make in kernels:
        n = fit_size(make, size, call_budget_s, device)
        timing = blocked(make(n), device=device)
        rows.append({"kernel": kernel, "dtype": "int8", "size": n, "gops": 2 * n**3 / timing.median / 1e9,
                     "n_blocks": len(timing.times)})
    df = pd.DataFrame(rows)
    df["vs_fp32"] = df["gops"] / df.loc[0, "gops"]
    native = opt.native_int_mm(device)
    for r in df.itertuples():
        note = "blocked_autorange median"
        if r.kernel == "torch._int_mm":
            note += ("; cuBLASLt int8" if device == "cuda" else "; oneDNN kernel (VNNI/AMX present)" if native
                     else "; no AVX512-VNNI/AMX-INT8 here: PyTorch's scalar fallback loop")
        if r.size != size:
            note += f"; measured at {r.size} (not {size}): a {size} call would exceed {call_budget_s} s"
        study.recorder.add(f"matmul {r.size}x{r.size} {r.kernel}", "peak_gops", r.gops, "GOP/s", n=r.n_blocks,
                           dtype=r.dtype, note=note)
    return df


def amdahl_bound(share_percent: float, roof_ratio: float) -> float:
    """Best UNet speed-up if only the Linear share ran at the int8 roof's ratio over fp32 and the rest stayed."""
    f = share_percent / 100.0
    return 1.0 / ((1.0 - f) + f / roof_ratio)


# ----------------------------------------------------------------------------------------- the comparison

def _torchao_too_slow(study: Study, share: dict, roofs: pd.DataFrame) -> str | None:
    """Why torchao is not timed whole, when its scalar _int_mm fallback alone would overrun variant_budget_s."""
    p = study.profile
    row = roofs[roofs.kernel == "torch._int_mm"]
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
    """Each scheme against fp32 eager by run_variants; torchao, when its scalar kernel would overrun the budget,
    is recorded as a skipped row with the reason instead of being run."""
    runnable, skipped = [], []
    for k in check(keys):
        reason = _torchao_too_slow(study, share, roofs) if scheme(k) == "torchao-int8-dynamic" else None
        if reason and opt.availability(study.device, scheme(k))[0]:
            print(f"{k}: skipped: {reason}")
            study.recorder.skipped(f"{k}, batch 1", reason)
            skipped.append({"variant": k, "key": k, "status": "skipped", "note": f"skipped: {reason}"})
        else:
            runnable.append(k)
    cmp = run_variants(study, runnable)
    if skipped:
        cmp.table = pd.concat([cmp.table, pd.DataFrame(skipped)], ignore_index=True).reindex(
            columns=cmp.table.columns)
    return cmp


def summary(cmp: Comparison) -> pd.DataFrame:
    """The columns a reader needs: set-up apart, each ratio with its range over rounds and its verdict."""
    cols = ["variant", "status", "setup_s", "first_call_s", "latency_s", "unet_step_s", "speedup", "speedup_lo",
            "speedup_hi", "speedup_verdict", "unet_step_speedup", "unet_step_speedup_lo", "unet_step_speedup_hi",
            "unet_step_speedup_verdict", "peak_memory_mib", "latent_rel_error", "image_psnr_db", "note"]
    return cmp.table[cols]


def facts_table(cmp: Comparison) -> pd.DataFrame:
    """What each prepared UNet is made of (from the worker: module counts, warnings, engine facts)."""
    return pd.DataFrame([{"variant": k, **v} for k, v in cmp.facts.items() if k not in (BASELINE, TWIN)])


def roofline(study: Study, cmp: Comparison, share: dict, roofs: pd.DataFrame) -> pd.DataFrame:
    """Achieved ops/s of each measured variant against fp32's roof and the int8 roof of the kernel it runs on,
    with the Amdahl ceiling for the Linear-only schemes."""
    roof = roofs.set_index("kernel")
    fp32 = float(roof.loc["torch.mm", "gops"])
    rows = []
    for r in cmp.ok().itertuples():
        name = scheme(r.key) if r.key.startswith("int8:") else None
        achieved = share["unet_flops"] / r.unet_step_s / 1e9
        row = {"variant": r.variant, "unet_step_s": r.unet_step_s, "achieved_gops": achieved,
               "percent_of_fp32_roof": 100 * achieved / fp32}
        kernel = ROOF_KERNEL.get(name)
        if kernel in roof.index:
            int8 = float(roof.loc[kernel, "gops"])
            row.update(int8_kernel=kernel, percent_of_int8_roof=100 * achieved / int8)
            study.recorder.add(f"{r.variant}, batch 1", "percent_of_int8_roof", row["percent_of_int8_roof"], "%",
                               note=f"UNet ops / median UNet call, of the measured {kernel} roof {int8:.1f} GOP/s "
                                    "(every op counted, int8 or not)")
            if name in LINEAR_ONLY:
                row["linear_only_ceiling_x"] = amdahl_bound(share["linear_share_percent"], int8 / fp32)
        rows.append(row)
    return pd.DataFrame(rows)


def verdicts(cmp: Comparison) -> pd.DataFrame:
    """Speed and drift of each measured scheme in one line (drift.verdict: below 40 dB PSNR a scheme changes
    the picture), with what random weights make of the error figures."""
    ok = cmp.ok()
    ok = ok[~ok.variant.str.startswith(BASELINE)]
    out = ok[["variant", "speedup", "speedup_lo", "speedup_hi", "speedup_verdict", "unet_step_speedup",
              "unet_step_speedup_verdict", "latent_rel_error", "image_psnr_db", "verdict"]].copy()
    out["caveat"] = RANDOM_WEIGHTS
    return out.reset_index(drop=True)


def published_vs_measured(study: Study, cmp: Comparison) -> pd.DataFrame:
    """The diffusers fast-diffusion tutorial's int8 rung (GPU, after compile) beside this device's best int8."""
    try:
        before = published.value("diffusers fast_diffusion", config="+ fused QKV")
        after = published.value("diffusers fast_diffusion", config="+ int8 dynamic quantization")
        figure, detail = before / after, f"{before} s -> {after} s"
    except KeyError:
        figure, detail = None, "figure not in published_inference.csv"
    ok = cmp.ok()
    ok = ok[~ok.variant.str.startswith(BASELINE)]
    best = ok.sort_values("speedup", ascending=False).head(1)
    measured = float(best["speedup"].iloc[0]) if len(best) else None
    b = best.iloc[0] if len(best) else None
    what = (f"{b['variant']} vs fp32 eager, per image at the profile's steps; range {b['speedup_lo']:.2f}-"
            f"{b['speedup_hi']:.2f}x over rounds, {b['speedup_verdict']}; {cmp.method}" if b is not None
            else "no int8 scheme measured")
    return pd.DataFrame([published_row(
        "int8 dynamic quantization speed-up", "diffusers docs, tutorials/fast_diffusion.md", "NVIDIA A100 80GB",
        "SDXL 1024px, 30 steps, batch 1, bf16 + SDPA + torch.compile + fused QKV, torchao int8 dynamic", figure,
        measured, f"{study.conditions(1)}; {what}", detail=detail)])


def plot(study: Study, cmp: Comparison):
    """Speed-up over fp32 eager (PSNR on the bars) and the latent error of each scheme."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    speedup_bars(cmp.table[cmp.table.variant != TWIN], f"int8 vs fp32 eager ({study.device}); bars: min-max over "
                 "rounds", ax=left)
    ok = cmp.ok()
    ok = ok[~ok.variant.str.startswith(BASELINE)]
    right.bar(ok["variant"], ok["latent_rel_error"], color=plt.cm.tab10.colors[:len(ok)])
    right.set(ylabel="latent relative error", yscale="log", title="drift from fp32 (random weights)")
    right.tick_params(axis="x", labelrotation=20)
    study.save_figure(fig, "int8_speedup_drift")
    return fig
