"""reports/<profile>/index.html: one self-contained page a reader can open from the folder, offline.

Every number is shown beside the conditions it was taken in; rows not measured say why in place of the number.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from urllib.parse import quote

from sdperf.core import paths
from sdperf.config.profiles import load_profile
from sdperf.report import answer
from sdperf.report.numbers import value_range
from sdperf.select import scenarios

RESULT_COLUMNS = ["scenario", "metric", "value", "unit", "p10", "p90", "n", "dtype", "note"]
NUMBER_COLUMNS = ("value", "p10", "p90")
NOT_MEASURED = ("not_applicable", "skipped", "failed")

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 72rem;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1 { margin-bottom: .2rem; } h2 { border-bottom: 2px solid #ddd; padding-bottom: .2rem; margin-top: 2.5rem; }
.sub { color: #666; margin-top: 0; }
.table-scroll { overflow-x: auto; max-width: 100%; margin: .6rem 0 1rem; }
table { border-collapse: collapse; margin: .6rem 0 1rem; font-size: .92rem; }
.table-scroll > table { margin: 0; }
th, td { border: 1px solid #ddd; padding: .25rem .6rem; text-align: left; vertical-align: top; }
td.long, table.kv td + td { overflow-wrap: anywhere; }
th { background: #f4f4f6; }
tbody tr:nth-child(even) { background: #fafafa; }
td.not_applicable, td.skipped { color: #666; font-style: italic; background: #f1f1f1; }
td.failed { color: #a40000; background: #fdeaea; font-weight: 600; }
td.ok.status { color: #17692b; font-weight: 600; }
td.partial { color: #8a5a00; background: #fff6e0; }
.badge { display: inline-block; padding: .1rem .5rem; border-radius: .3rem; font-weight: 600; }
.badge.ok { background: #e3f4e6; color: #17692b; } .badge.failed { background: #fdeaea; color: #a40000; }
.badge.unknown { background: #eee; color: #555; }
.failure { border-left: 4px solid #a40000; background: #fdeaea; padding: .4rem .8rem; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: .9rem; }
.links a { margin-right: 1rem; }
details summary { cursor: pointer; }
.finding { background: #f4f8fc; border-left: 4px solid #2a6ebb; padding: .4rem .8rem; }
ul.findings li { margin-bottom: .35rem; }
ul.legend { font-size: .85rem; color: #444; }
p.legend { font-size: .85rem; color: #444; margin-bottom: 0; }
table.published { width: 100%; table-layout: fixed; }
table.published td { overflow-wrap: anywhere; }
table.published td.not_measured { color: #666; font-style: italic; background: #f1f1f1; }
table.published .where { color: #555; font-size: .85rem; }
"""


def fmt(value) -> str:
    """Four significant digits: enough to compare, few enough to read."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if not isinstance(value, float):
        return str(value)
    text = f"{value:.4g}"
    # 1.235e+06 reads worse than 1,235,000 and says no more; keep exponents for the truly huge or tiny
    return f"{float(text):,.0f}" if "e+" in text and abs(value) < 1e15 else text


def _esc(value) -> str:
    return html.escape(str(value))


def _href(path: str) -> str:
    return html.escape(quote(path), quote=True)


def _kv_table(mapping: dict, key: str = "setting", value: str = "value") -> str:
    import pandas as pd

    df = pd.DataFrame({key: list(mapping), value: [fmt(v) for v in mapping.values()]})
    return _scrolling(df.to_html(index=False, escape=True, border=0, classes="kv"))


def _styled_table(df, classes, uuid: str) -> str:
    """pandas' Styler: the one pandas renderer that can mark rows by status; cells stay HTML-escaped."""
    from pandas.io.formats.style import Styler

    styler = Styler(df, uuid=uuid, cell_ids=False).hide(axis="index").format(escape="html")
    classes = classes.copy()
    for col in (c for c in _long_token_columns(df) if c in classes.columns):
        classes[col] = (classes[col].fillna("").astype(str) + " long").str.strip()
    return _scrolling(styler.set_td_classes(classes).to_html())


LONG_TOKEN = 30  # characters: a word longer than this (a path, a repr, a stack key) may break anywhere


def _long_token_columns(df) -> list:
    """Columns holding a word longer than LONG_TOKEN: only their cells may break inside a word (CSS `td.long`)."""
    return [col for col in df.columns
            if df[col].astype(str).str.split().explode().fillna("").str.len().max() > LONG_TOKEN]


def _scrolling(table_html: str) -> str:
    """A table never widens the page: one still wider than the text column scrolls sideways inside this container."""
    return f"<div class='table-scroll'>{table_html}</div>"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_stamps(profile: str) -> dict[str, dict]:
    """Each notebook's last complete stamp; `interrupted` holds a later killed run's marker (status if none ran)."""
    from sdperf.store.stamps import interrupted

    folder = paths.profile_reports(profile) / "notebooks"
    stamps = {}
    for path in sorted(folder.glob("*.run.json")):
        stamp = _read_json(path)
        if isinstance(stamp, dict) and stamp:
            stamps[stamp.get("notebook") or path.name.removesuffix(".run.json")] = stamp
    for path in sorted(folder.glob("*.running.json")):
        name = path.name.removesuffix(".running.json")
        marker = interrupted(profile, name)
        if marker is not None:
            stamps.setdefault(name, {"notebook": name, "status": "interrupted"})["interrupted"] = marker
    return stamps


def interrupted_text(stamp: dict) -> str:
    marker = stamp.get("interrupted")
    if marker is None:
        return ""
    run = f"run {marker['run_id']}, " if marker.get("run_id") else ""
    started = f"started {marker['started_utc']}" if marker.get("started_utc") else "started at an unknown time"
    shown = "no complete run exists" if stamp.get("status") == "interrupted" else "these are its last complete results"
    return f"a later run ({run}{started}) was interrupted; {shown}; the next `sdperf run` reruns it"


def failure_text(stamp: dict) -> str:
    err = stamp.get("error") or {}
    where = f"cell {err['cell_index']}" if err.get("cell_index") is not None else "before any cell ran"
    return f"{where} ({err.get('ename', '?')}: {err.get('evalue', '')})"


def _beside_load_rows(rows) -> str:
    """A notebook's rows measured beside other load (sdperf.measure.contention), in words; '' when none."""
    from sdperf.measure.contention import BESIDE_LOAD

    marked = rows[rows["note"].astype(str).str.contains(BESIDE_LOAD, regex=False)]
    if marked.empty:
        return ""
    return (f"{len(marked)} row(s) {BESIDE_LOAD.lower()} (their notes say how much), e.g. "
            f"{marked['scenario'].iloc[0]}")


def _summary_section(names: list[str], stamps: dict, results) -> str:
    import pandas as pd

    rows, statuses = [], []
    for name in names:
        stamp = stamps.get(name, {})
        status = stamp.get("status", "unknown")
        counts = results[results["notebook"] == name]["status"].value_counts()
        problem = failure_text(stamp) if status == "failed" else interrupted_text(stamp)
        problem = "; ".join(filter(None, [problem, _beside_load_rows(results[results["notebook"] == name])]))
        if status == "ok" and counts.get("failed", 0):  # the notebook ran; some of its rows did not
            status = "partial"
            failed = results[(results["notebook"] == name) & (results["status"] == "failed")]
            problem = (f"{counts['failed']} row(s) failed, e.g. {failed['scenario'].iloc[0]}: "
                       f"{str(failed['note'].iloc[0])[:160]}" + (f"; {problem}" if problem else ""))
        rows.append({"notebook": name, "status": status, "seconds": fmt(stamp.get("duration_s")),
                     "finished (UTC)": stamp.get("finished_utc", ""), "commit": stamp.get("commit", ""),
                     "rows ok / n.a. / failed": f"{counts.get('ok', 0)} / {counts.get('not_applicable', 0)} / "
                                                f"{counts.get('failed', 0)}",
                     "problem": problem})
        statuses.append(status)
    if not rows:
        return "<h2 id='summary'>Study summary</h2><p>No notebook has run for this profile yet.</p>"
    df = pd.DataFrame(rows)
    classes = pd.DataFrame([[s] * len(df.columns) for s in statuses], columns=df.columns)
    classes["status"] = [f"{s} status" for s in statuses]
    from sdperf.judge.techniques import reuse_sentence

    reuse = reuse_sentence(results)
    return ("<h2 id='summary'>Study summary</h2>" + _styled_table(df, classes, "summary") +
            (f"<p>{_esc(reuse)}</p>" if reuse else ""))


NOT_RECORDED = "not recorded (environment.json from an earlier sdperf)"


def _threads_allocator_gpu_facts(env: dict) -> dict:
    """The environment record's thread settings, allocator and GPU as table rows (NOT_RECORDED when absent)."""
    threads = env.get("thread_settings") or {}
    facts = {f"threads: {k.replace('_', ' ')}": threads.get(k, NOT_RECORDED)
             for k in ("intra_op_threads", "inter_op_threads", "parallel_backend", "omp_max_threads",
                       "mkl_max_threads")}
    thread_env = threads.get("env")
    facts["thread env"] = (", ".join(f"{k}={v}" for k, v in thread_env.items() if v != "unset") or "none set"
                           if thread_env is not None else NOT_RECORDED)
    facts["allocator"] = env.get("allocator", NOT_RECORDED)
    gpu = env.get("gpu", NOT_RECORDED)
    if isinstance(gpu, dict):
        facts.update({f"GPU {k.replace('_', ' ')}": v for k, v in gpu.items()})
    else:
        facts["GPU"] = gpu
    return facts


def _beside_facts(env: dict) -> dict:
    if "beside_survivors" not in env:
        return {"measured beside": NOT_RECORDED}
    survivors = env.get("beside_survivors") or []
    load = env.get("beside_load")
    return {"measured beside survivors": "; ".join(f"pid {s.get('pid')} ({s.get('role')} of {s.get('stack')})"
                                                   for s in survivors) or "none (a quiet start)",
            "measured beside load": (f"other processes took {load.get('others_share', 0):.0%} of the CPUs' time "
                                     "at the start (--beside-load)") if isinstance(load, dict) else "none"}


def _environment_section(env: dict | None, settings: dict) -> str:
    parts = ["<h2 id='environment'>Environment</h2>"]
    if env is None:
        parts.append("<p>No environment.json: this profile has not been run with <code>sdperf run</code>.</p>")
    else:
        isa = env.get("cpu_isa") or {}
        facts = {k: env.get(k, NOT_RECORDED)
                 for k in ("device", "device_name", "cpu_model", "cpu_family_model_stepping", "machine",
                           "physical_cores", "logical_cpus", "usable_cpus", "threads", "cpu_caches", "memory_gib",
                           "cuda", "cuda_available", "python", "platform", "commit", "time_utc")}
        facts["ISA flags present"] = ", ".join(f for f, on in isa.items() if on) or "none of those checked"
        facts["ISA flags absent"] = ", ".join(f for f, on in isa.items() if not on) or "none"
        facts["allocator env"] = ", ".join(f"{k}={v}" for k, v in (env.get("malloc_env") or {}).items()) or "unset"
        facts.update(_threads_allocator_gpu_facts(env))
        facts.update(_beside_facts(env))
        packages = {k: v or "not installed" for k, v in (env.get("packages") or {}).items()}
        parts += ["<h3>Machine</h3>", _kv_table(facts), "<details><summary>Package versions</summary>",
                  _kv_table(packages, "package", "version"), "</details>"]
    settings = {**settings, "weights": settings.get("weights") or "none: random init"}
    parts += ["<h3>Profile settings</h3>", _kv_table(settings)]
    return "\n".join(parts)


def _results_table(rows, uuid: str) -> str:
    import pandas as pd

    rows = rows.reset_index(drop=True)
    shown = pd.DataFrame({c: rows[c] if c in rows else "" for c in RESULT_COLUMNS})
    for col in NUMBER_COLUMNS:
        shown[col] = [fmt(v) for v in shown[col]]
    shown["n"] = [fmt(int(v)) if isinstance(v, (int, float)) and not math.isnan(v) else fmt(v) for v in shown["n"]]
    shown = shown.fillna("").astype(str)
    not_measured = rows["status"].isin(NOT_MEASURED)
    shown.loc[not_measured, "value"] = rows.loc[not_measured, "note"].fillna("").astype(str)
    shown.loc[not_measured, "note"] = rows.loc[not_measured, "status"]
    row_class = rows["status"].where(not_measured, "").astype(str)
    classes = pd.DataFrame({c: row_class for c in shown.columns})
    return _styled_table(shown, classes, uuid)


NO_CAPTION = "No caption recorded: this figure was drawn before captions existed; rerun the notebook."


def _figures(profile: str, name: str) -> str:
    """Each figure of notebook `name` with its stored caption and its SVG link, loaded eagerly."""
    figs = []
    for png in sorted(paths.figures_dir(profile).glob(f"{name}__*.png")):
        svg = png.with_suffix(".svg")
        link = f" · <a href='{_href('figures/' + svg.name)}'>SVG</a>" if svg.is_file() else ""
        text, alt, missing = _caption_text(png)
        figs.append(f"<figure><img src='{_href('figures/' + png.name)}' alt='{_esc(alt)}'>"
                    f"<figcaption{missing}>{_esc(text)}{link}</figcaption></figure>")
    return "\n".join(figs)


def _caption_text(png: Path) -> tuple[str, str, str]:
    """(caption text, alt text, class attribute): its stored caption, or why there is none, marked class='missing'."""
    from sdperf.store import figure_captions

    try:
        caption = figure_captions.read(png)
    except ValueError as e:
        return f"Caption unreadable ({e}); rerun the notebook.", png.stem, " class='missing'"
    if caption is None:
        return NO_CAPTION, png.stem, " class='missing'"
    return caption.text(), caption.what, ""


EXECUTED_COPIES = ((".html", "executed notebook (HTML)"), (".ipynb", "executed notebook (.ipynb)"),
                   (".failed.html", "failed run (HTML)"), (".failed.ipynb", "failed run (.ipynb)"))


def _links(profile: str, name: str) -> str:
    folder = paths.profile_reports(profile) / "notebooks"
    links = [f"<a href='{_href('notebooks/' + name + suffix)}'>{_esc(label)}</a>"
             for suffix, label in EXECUTED_COPIES if (folder / f"{name}{suffix}").is_file()]
    return f"<p class='links'>{' '.join(links)}</p>" if links else "<p>No executed copy of this notebook.</p>"


def _status_line(stamp: dict | None) -> str:
    if not stamp:
        return "<p><span class='badge unknown'>no run record</span></p>"
    status = stamp.get("status", "unknown")
    meta = (f"{fmt(stamp.get('duration_s'))} s · commit {stamp.get('commit', '?')} · "
            f"finished {stamp.get('finished_utc', '?')}")
    line = f"<p><span class='badge {_esc(status)}'>{_esc(status)}</span> {_esc(meta)}</p>"
    if status == "failed":
        line += f"<p class='failure'>Stopped at {_esc(failure_text(stamp))}</p>"
    if stamp.get("interrupted") is not None:
        text = interrupted_text(stamp)
        line += f"<p class='failure'>{_esc(text[:1].upper() + text[1:])}.</p>"
    return line


def _notebook_section(profile: str, name: str, rows, stamp: dict | None, i: int, results=None) -> str:
    parts = [f"<h2 id='{_esc(name)}'>{_esc(name)}</h2>", _status_line(stamp), _links(profile, name)]
    if len(rows):
        from sdperf.report.findings import detail, verdict

        counts = rows["status"].value_counts()
        tally = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items())
        parts.append(f"<p class='finding'>{verdict(name, rows)}</p>")
        more = detail(name, rows if results is None else results)
        if more:
            parts.append(f"<p>{more}</p>")
        parts.append(f"<details><summary>All {len(rows)} rows ({_esc(tally)})</summary>"
                     + _results_table(rows, f"nb{i}") + "</details>")
    else:
        parts.append("<p>No results recorded.</p>")
    parts.append(_figures(profile, name))
    return "<section>" + "\n".join(parts) + "</section>"


LADDER = answer.LADDER
LADDER_METRICS = {"latency": "s / image", "speedup_vs_fp32": "x fp32 eager", "speedup_vs_rung_below": "x rung below",
                  "unet_step_speedup_vs_fp32": "x per UNet step", "image_psnr_db": "PSNR dB vs fp32"}


def _ladder_section(profile: str, results) -> str:
    import pandas as pd

    rows = results[results["notebook"] == LADDER]
    if rows.empty:
        return ""
    rungs = scenarios.rungs(rows)
    out = []
    for scenario, g in rungs.groupby("scenario", sort=False):
        not_measured = g[g["status"].isin(NOT_MEASURED)]
        line = {"rung": scenario.removesuffix(", batch 1")}
        if len(not_measured):
            line.update({"status": not_measured["status"].iloc[0], "why not measured": not_measured["note"].iloc[0]})
        else:
            vals = dict(zip(g["metric"], g["value"]))
            line.update({"status": "ok", **{label: fmt(vals.get(m)) for m, label in LADDER_METRICS.items()}})
        out.append(line)
    df = pd.DataFrame(out).fillna("")
    classes = pd.DataFrame({c: df["status"].where(df["status"].isin(NOT_MEASURED), "") for c in df.columns})
    return ("<h2 id='ladder'>The ladder</h2><p>Every rung is the whole stack up to it, measured in one run against "
            "the fp32 eager baseline on the same latents (details in the 10_ladder section below).</p>"
            + _styled_table(df, classes, "ladder") + _figures(profile, LADDER))


def _range(v: dict, metric: str, digits: int = 2, unit: str = "x") -> str:
    r = v.get(metric)
    return "not measured" if r is None else value_range(r["value"], r.get("lo"), r.get("hi"), digits, unit)


def headline_sentences(results, legend=None) -> list[str]:
    """The study's answer, one sentence per chosen stack, from 10's headline rows; methods cited into `legend`."""
    rows = results[results["notebook"] == LADDER] if len(results) else results
    out = []
    for kind in scenarios.HEADLINES:
        mine = scenarios.of_kind(rows, kind)
        if mine.empty:
            continue
        v = {r.metric: {"value": r.value, "lo": getattr(r, "lo", None), "hi": getattr(r, "hi", None),
                        "note": r.note} for r in mine.itertuples()}
        key = scenarios.subject(mine["scenario"].iloc[0], kind)
        per_image = v.get("seed_speedup_vs_fp32", {})
        s = (f"{kind.capitalize()} on this machine: <b>{_esc(key)}</b>, "
             f"{_range(v, 'seed_speedup_vs_fp32')} per image over fp32 eager at 50 PLMS steps "
             f"({_esc(per_image.get('note', ''))}), {_range(v, 'unet_step_speedup_vs_fp32')} per UNet step")
        seeds = answer.seeds_quality(results) if "key" in mine and answer.lossless(mine["key"].iloc[0]) else None
        if seeds is not None:  # its pictures are fp32 PLMS-50's: that sampler's own rows say what they cost
            fid = seeds["fid_delta"]["value"]
            s += (f"; its pictures are fp32 PLMS-50's own, which on the trained reference model read adherence "
                  f"{_range(seeds, 'adherence_delta', 3, '')}"
                  + ("" if fid is None or math.isnan(fid) else f" and domain FID {_range(seeds, 'fid_delta', 1, '')}")
                  + f" against the converged fp32 solve ({_esc(seeds['verdict'])}, n={seeds['n']})")
        elif "reference_adherence_delta" in v:
            s += (f"; on the trained reference model adherence {_range(v, 'reference_adherence_delta', 3, '')} and "
                  f"domain FID {_range(v, 'reference_domain_fid_delta', 1, '')} against "
                  f"{'the converged fp32 solve' if 'converged' in str(v['reference_adherence_delta']['note']) else 'fp32 PLMS-50'} "
                  f"({_esc(v['reference_adherence_delta']['note'])})")
        if "setup" in v:
            s += f"; set-up {v['setup']['value']:.0f} s"
        if "peak_memory" in v:
            s += f", peak memory {v['peak_memory']['value']:.0f} MiB"
        if "roof_goal_x" in v:
            s += f"; per-step goal {v['roof_goal_x']['value']:.2f}x ({_esc(v['roof_goal_x']['note'])})"
        method = mine["method"].iloc[0]
        out.append(s + (f". Method {legend.cite(method)}." if legend is not None else f". Method: {_esc(method)}."))
    return out


def no_admissible_sentence(results) -> str | None:
    """When the search judged stacks and none was admissible: how many were judged and how they failed, else None."""
    rows = results[results["notebook"] == LADDER] if len(results) else results
    if rows.empty or not scenarios.of_kind(rows, scenarios.BEST_STACK).empty:
        return None
    judged = scenarios.of_kind(rows, scenarios.SEARCH)
    if judged.empty:
        return None
    verdicts = judged["note"].astype(str).str.split(";", n=1).str[0].str.split(":", n=1).str[-1].str.strip() \
        .value_counts()  # the note is "<admissible>: <why>; <each part's own verdict>"
    fastest = judged.sort_values("value", ascending=False).iloc[0]
    return (f"No stack within the quality budget was found: the search judged {len(judged)} candidates "
            f"({', '.join(f'{n} {_esc(v)}' for v, n in verdicts.items())}); the fastest judged, "
            f"<b>{_esc(scenarios.subject(fastest['scenario'], scenarios.SEARCH))}</b>, composed at {fastest['value']:.2f}x per image, "
            f"was {_esc(str(fastest['note']))}.")


def _findings_section(results, names: list[str], legend=None) -> str:
    from sdperf.report.findings import Legend, verdicts

    legend = Legend() if legend is None else legend
    found = verdicts(results, names, legend)
    items = "".join(f"<li><a href='#{_href(n)}'>{_esc(n)}</a>: {v}</li>" for n, v in found.items())
    methods = (f"<p class='legend'>Methods cited above:</p><ul class='legend'>{legend.html()}</ul>"
               if legend.texts else "")
    return (f"<h2 id='findings'>What each notebook found</h2><ul class='findings'>{items}</ul>{methods}"
            if items else "")


PUBLISHED_WIDTHS = (12, 16, 21, 25, 5, 21)  # % of the page: source, claim, published, measured, method, why


def _published_cell(r) -> str:
    """The published figure (a ratio, a change or only words), what it divides, and its hardware and settings."""
    detail = _esc(r.published_detail)
    if r.published is None or r.published != r.published:
        figure = detail
    else:
        unit = "x" if r.published_unit == "x" else f" {_esc(r.published_unit)}"
        figure = f"<b>{r.published:g}{unit}</b> ({detail})"
    return f"{figure}<br><span class='where'>{_esc(r.hardware)}; {_esc(r.settings)}</span>"


def _published_section(results) -> str:
    """Every claim of sdperf.report.published_vs_measured beside the figure measured here. No text is cut short."""
    from sdperf.report import published_vs_measured as pvm

    t = pvm.table(results)
    methods = list(dict.fromkeys(m for m in t.method if m))  # each told once, under the table
    rows = []
    for r in t.itertuples():
        linked = r.url.startswith(("https://", "http://"))
        source = (f"<a href='{_esc(r.url)}'>{_esc(r.source)}</a>" if linked
                  else f"{_esc(r.source)}<br><span class='where'>{_esc(r.url)}</span>")
        if r.url_note:
            source += f"<br><span class='where'>{_esc(r.url_note)}</span>"
        if r.measured_x is None or r.measured_x != r.measured_x:
            measured = f"<td class='not_measured'>{_esc(r.measured)}</td>"
        else:
            measured = f"<td><b>{_esc(r.measured)}</b><br><span class='where'>{_esc(r.measured_what)}</span></td>"
        m = methods.index(r.method) + 1 if r.method else 0
        method = f"<a href='#published-method-{m}'>M{m}</a>" if m else ""
        rows.append(f"<tr><td>{source}</td><td>{_esc(r.claim)}</td><td>{_published_cell(r)}</td>{measured}"
                    f"<td>{method}</td><td>{_esc(r.why_they_differ)}</td></tr>")
    done = int(t.measured_x.notna().sum())
    cols = "".join(f"<col style='width:{w}%'>" for w in PUBLISHED_WIDTHS)
    head = "".join(f"<th>{h}</th>" for h in ("source", "claim", "published (hardware; settings)", "measured here",
                                             "method", "why they can differ"))
    return (f"<h2 id='published'>Published vs measured</h2>"
            f"<p>Every seed claim and every anchor the study compares with: the published figure with its hardware "
            f"and settings and a link to its source, beside the figure this run's rows hold (median with its range; "
            f"its method) or the rows' own reason it was not measured, and why the two can differ. Compare ratios, "
            f"not seconds: the hardware differs.</p><details open><summary>{len(t)} claims from "
            f"{t.source.nunique()} sources: {done} measured here, {len(t) - done} not measured here</summary>"
            f"<table class='published'><colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table><p>Methods of the measured figures:</p><ul>"
            + "".join(f"<li id='published-method-{i}'>M{i}: {_esc(m)}</li>" for i, m in enumerate(methods, 1))
            + "</ul></details>")


def one_machine(results):
    """(the rows of the newest row's machine and commit, a notice counting the rest): never mix incomparable rows."""
    if results.empty or "machine" not in results or "commit" not in results:
        return results, ""
    newest = results.sort_values("time_utc", kind="stable").iloc[-1]
    machine, commit = str(newest["machine"]), str(newest["commit"])
    same = (results["machine"].astype(str) == machine) & (results["commit"].astype(str) == commit)
    if same.all():
        return results, ""
    others = results[~same].groupby(["commit", "machine"]).size()
    listed = "; ".join(f"{n} row(s) at commit {_esc(c)} on machine {_esc(m)}" for (c, m), n in others.items())
    notice = (f"<p class='failure'>Shown: rows of machine {_esc(machine)} at commit {_esc(commit)} only. Refused "
              f"(another machine or commit, never mixed into one table): {listed}. Rerun those notebooks here "
              f"(<code>sdperf run --profile ...</code>) to show them.</p>")
    return results[same].reset_index(drop=True), notice


def _doctor_section(profile: str, results) -> str:
    from sdperf.measure import doctor

    found = _read_json(paths.profile_reports(profile) / doctor.RECORD_NAME)
    if found is None:
        return (f"<p class='doctor'>No <code>sdperf doctor</code> record for this profile yet "
                f"(<code>sdperf doctor --profile {_esc(profile)} --record</code> writes one; "
                f"<code>sdperf run</code> records its own).</p>")
    rows = found.get("rungs") or []
    table = "".join(f"<tr><td>{_esc(r['rung'])}</td><td>{_esc(r['notebook'])}</td><td>{_esc(r['verdict'])}</td>"
                    f"<td>{_esc(r['reason'])}</td></tr>" for r in rows)
    machines = set(results["machine"].astype(str)) if len(results) and "machine" in results else set()
    other = (f" <b>It was recorded on machine {_esc(found.get('machine'))}, not the machine of the rows below "
             f"({_esc(', '.join(sorted(machines)))}).</b>") if machines and found.get("machine") not in machines else ""
    lines = "".join(f"<li>{_esc(line)}</li>" for line in found.get("machine_lines") or [])
    return (f"<p class='doctor'><b>What can run here</b> (<code>sdperf doctor</code>, machine "
            f"{_esc(found.get('machine'))}, commit {_esc(found.get('commit'))}, {_esc(found.get('time_utc'))}): "
            f"{_esc(doctor.tally(rows))}.{other}</p>"
            f"<details><summary>Every rung with its verdict and reason</summary><ul>{lines}</ul>"
            f"<table class='doctor'><thead><tr><th>rung</th><th>notebook</th><th>verdict</th><th>reason</th></tr>"
            f"</thead><tbody>{table}</tbody></table></details>")


def _not_yet_measured_section(profile, results) -> str:
    if len(results):
        return ""
    where = "on a GPU" if profile.device != "cpu" else "on this machine"
    need = " on a machine with an NVIDIA GPU (the pinned GPU extras come with it: <code>make install-gpu</code>)" \
        if profile.device == "cuda" else ""
    return (f"<p class='failure'><b>Not yet measured {where}.</b> No row of profile {_esc(profile.name)} exists. "
            f"Run <code>make study PROFILE={_esc(profile.name)}</code>{need}; <code>sdperf doctor --profile "
            f"{_esc(profile.name)}</code> first lists every rung with \"will run\" or why not. The published "
            f"figures below are what its rows will be set against.</p>")


def _headline_section(results, legend=None) -> str:
    found = headline_sentences(results, legend)
    missing = no_admissible_sentence(results)
    found = ([missing] if missing else []) + found
    from sdperf.judge import transfer

    quality = transfer.sentence(results) if len(results) else None
    found += [_esc(quality)] if quality else []
    if not found:
        return ""
    return "<h2 id='headline'>The answer</h2>" + "".join(f"<p>{s}</p>" for s in found)


def _page(title: str, body: list[str]) -> str:
    return (f"<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>\n<title>{_esc(title)}</title>\n"
            f"<style>{CSS}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n")


def notebooks_of(names: list[str], stamps: dict[str, dict]) -> list[str]:
    """The notebooks among `names`, not the parts of `sdperf run` stamped like one (eta.ROUNDS_STAMP_NAME)."""
    return [n for n in names if not (stamps.get(n) or {}).get("part")]


def write_index(profile: str) -> Path:
    """Rebuild the page from what is on disk, so it can be regenerated without rerunning anything."""
    from sdperf.store.results import atomic_write_text, read_results

    folder = paths.profile_reports(profile)
    env = _read_json(folder / "environment.json")
    chosen = load_profile(profile, check_runtime=False)
    settings = chosen.summary()
    stamps = read_stamps(profile)
    results, refused = one_machine(read_results(profile))
    names = sorted(set(results["notebook"].astype(str)) | set(stamps))
    from sdperf.report.findings import Legend

    legend = Legend()  # the answer and the findings cite methods by label; each text appears once, under the findings
    title = f"sdperf study: profile {profile}"
    body = [f"<h1>{_esc(title)}</h1>",
            f"<p class='sub'>{_esc(settings.get('description', ''))}</p>",
            refused,
            _not_yet_measured_section(chosen, results),
            _doctor_section(profile, results),
            _headline_section(results, legend),
            _findings_section(results, notebooks_of(names, stamps), legend),
            _published_section(results),
            _summary_section(names, stamps, results),
            _ladder_section(profile, results),
            _environment_section(env, settings)]
    body += [_notebook_section(profile, name, results[results["notebook"] == name], stamps.get(name), i, results)
             for i, name in enumerate(names)]
    path = folder / "index.html"
    atomic_write_text(path, _page(title, body))
    return path
