"""Every figure carries its caption: required before anything is written, stored beside the figure, staged,
promoted and deleted with it, rendered by the report; and ratio axes turn logarithmic past a 10x span."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from sdperf.core import paths  # noqa: E402
from sdperf.report import report  # noqa: E402
from sdperf.store import figure_captions, plots, staging  # noqa: E402
from sdperf.core.environment import RUN_ID_ENV  # noqa: E402
from sdperf.measure.study import Study  # noqa: E402

CPU_ENV = {"device": "cpu", "device_name": "Test CPU 9000", "cpu_model": "Test CPU 9000",
           "cpu_family_model_stepping": "6/207/2", "threads": 2}
CAPTION = dict(what="A test figure", baseline="fp32 eager", method="one round by hand", n="3 rounds")


@pytest.fixture
def study(smoke, scratch_reports):
    return Study(notebook="00_caps", profile=smoke, env=dict(CPU_ENV), recorder=None)


def _fig():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    return fig


def _files(folder, notebook="00_caps"):
    return sorted(p.name for p in folder.glob(f"{notebook}__*")) if folder.is_dir() else []


@pytest.mark.parametrize("missing", ["what", "baseline", "method", "n"])
def test_a_figure_without_a_caption_field_fails_before_anything_is_written(study, missing):
    for bad in (None, "  "):
        with pytest.raises(ValueError, match=rf"figure caption: {missing} missing or empty"):
            study.save_figure(_fig(), "bars", **{**CAPTION, missing: bad})
    assert _files(paths.figures_dir("smoke")) == []
    assert not list(paths.profile_reports("smoke").rglob("*00_caps*"))
    plt.close("all")


def test_the_caption_is_stored_beside_the_figure_with_the_device_from_the_environment(study):
    out = study.save_figure(_fig(), "bars", **CAPTION)
    plt.close("all")
    assert _files(paths.figures_dir("smoke")) == ["00_caps__bars.caption.json", "00_caps__bars.png",
                                                  "00_caps__bars.svg"]
    stored = json.loads(out["caption"].read_text())
    assert stored["device"] == "CPU Test CPU 9000 (family/model/stepping 6/207/2), 2 torch threads"
    assert {k: stored[k] for k in CAPTION} == CAPTION
    caption = figure_captions.read(out["png"])
    assert caption.text() == stored["text"] and "Baseline: fp32 eager." in caption.text()


def test_the_device_names_the_gpu_under_cuda_and_a_published_figure_says_so():
    gpu = figure_captions.device_text({**CPU_ENV, "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"})
    assert gpu.startswith("GPU NVIDIA H100 80GB HBM3") and "Test CPU 9000" in gpu
    assert "nothing in this figure was measured here" in figure_captions.device_text(
        {"published_hardware": "DGX H100"})


def test_the_caption_is_staged_promoted_and_deleted_with_its_figure(study, monkeypatch):
    monkeypatch.setenv(staging.STAGE_ENV, "00_caps")
    monkeypatch.setenv(RUN_ID_ENV, "run-1")
    study.save_figure(_fig(), "old", **CAPTION)
    study.save_figure(_fig(), "kept", **CAPTION)
    staged = staging.figures_path("smoke", "run-1")
    assert "00_caps__old.caption.json" in _files(staged) and _files(paths.figures_dir("smoke")) == []
    assert staging.promote_figures("smoke", "00_caps", "run-1") == 6
    final = paths.figures_dir("smoke")
    assert "00_caps__old.caption.json" in _files(final) and _files(staged) == []

    monkeypatch.setenv(RUN_ID_ENV, "run-2")  # the next run no longer draws 'old'
    study.save_figure(_fig(), "kept", **{**CAPTION, "n": "4 rounds"})
    staging.promote_figures("smoke", "00_caps", "run-2")
    assert _files(final) == ["00_caps__kept.caption.json", "00_caps__kept.png", "00_caps__kept.svg"]
    assert figure_captions.read(final / "00_caps__kept.png").n == "4 rounds"

    monkeypatch.setenv(RUN_ID_ENV, "run-3")  # an unfinished run: its staged caption goes with its figure
    study.save_figure(_fig(), "kept", **{**CAPTION, "n": "5 rounds"})
    staging.discard("smoke", "00_caps", "run-3")
    assert _files(staging.figures_path("smoke", "run-3")) == []
    assert figure_captions.read(final / "00_caps__kept.png").n == "4 rounds"
    plt.close("all")


def test_the_report_renders_each_caption_or_says_there_is_none(study):
    study.save_figure(_fig(), "with", **CAPTION)
    plt.close("all")
    folder = paths.figures_dir("smoke")
    (folder / "00_caps__without.png").write_bytes((folder / "00_caps__with.png").read_bytes())
    (folder / "00_caps__broken.png").write_bytes(b"")
    (folder / "00_caps__broken.caption.json").write_text(json.dumps({"what": "x"}))
    page = report._figures("smoke", "00_caps")
    figs = {f.split("</figure>")[0].split("figures/")[1].split("'")[0]: f for f in page.split("<figure>")[1:]}
    assert "loading=" not in page
    assert "A test figure. Device: CPU Test CPU 9000 (family/model/stepping 6/207/2), 2 torch threads." in \
        figs["00_caps__with.png"] and "href='figures/00_caps__with.svg'" in figs["00_caps__with.png"]
    assert ("<figcaption class='missing'>No caption recorded: this figure was drawn before captions existed; rerun "
            "the notebook.") in figs["00_caps__without.png"]
    assert "class='missing'>Caption unreadable" in figs["00_caps__broken.png"] and "baseline" in \
        figs["00_caps__broken.png"]


def _bars(*speedups):
    return pd.DataFrame({"variant": [f"v{i}" for i in range(len(speedups))], "status": "ok",
                         "speedup": list(speedups), "speedup_lo": [s * 0.95 for s in speedups],
                         "speedup_hi": [s * 1.05 for s in speedups]})


@pytest.mark.parametrize("speedups, scale", [((1.0, 0.02, 0.9), "log"), ((1.0, 14.0), "log"),
                                             ((1.0, 0.2, 1.8), "linear"), ((1.0, 9.0), "linear")])
def test_speedup_bars_turn_logarithmic_above_a_tenfold_span(speedups, scale):
    fig = plots.speedup_bars(_bars(*speedups), "t")
    ax = fig.axes[0]
    assert ax.get_yscale() == scale
    if scale == "log":
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert "1x" in labels and all(t.endswith("x") for t in labels)
        low, high = ax.get_ylim()
        assert low < min(speedups) * 0.95 and high > max(speedups) * 1.05  # every bar and range inside
    plt.close(fig)
