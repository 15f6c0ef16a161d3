"""generate_folder on the tiny pipeline: the same pixels as generation.generate, the same files from 1 or 2 shards,
a lost row recovered and nothing rewritten, no model built when nothing is missing."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from sdperf.core.errors import ConfigError
from sdperf.model.generation import generate
from sdperf.imagegen import generate_folder, plan_keys, read_manifest
from sdperf.imagegen import store
from sdperf.imagegen.render import render, to_uint8, workload
from sdperf.model.prompts import Caption

CAPTIONS = [Caption("7", "a red bicycle against a wall"), Caption("12", "two dogs on a beach"),
            Caption("3", "a bowl of oranges")]
GUIDANCE = [1.0, 7.5]
KEYS = plan_keys([c.id for c in CAPTIONS], GUIDANCE, base_seed=0)  # smoke: seed 0, caption i gets seed i


def _files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.glob("g*/*.png"))}


def _stamps(folder) -> dict[str, tuple[int, int]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("g*/*.png")}


def _no_model(monkeypatch):
    import sdperf.imagegen.folder as folder

    monkeypatch.setattr(folder, "_build", lambda p: pytest.fail("a model was built with nothing to generate"))


@pytest.fixture(scope="module")
def one_rank(smoke, tiny_pipe, tmp_path_factory):
    out = tmp_path_factory.mktemp("one_rank")
    summary = generate_folder(smoke, CAPTIONS, out, GUIDANCE, pipe=tiny_pipe, progress=False)
    return out, summary


def test_one_image_is_exactly_generation_generate(smoke, tiny_pipe):
    caption = "a red bicycle against a wall"
    expected = to_uint8(generate(tiny_pipe, workload(smoke, caption, 7.5, 3)).images)
    np.testing.assert_array_equal(render(tiny_pipe, smoke, [(caption, 7.5, 3)]), expected)


@pytest.mark.parametrize("guidance", [1.0, 7.5])
def test_a_batch_of_prompts_matches_each_prompt_alone(smoke, tiny_pipe, guidance):
    items = [("a red bicycle", guidance, 0), ("two dogs on a beach", guidance, 5)]
    batched = render(tiny_pipe, smoke, items).astype(int)
    alone = np.concatenate([render(tiny_pipe, smoke, [item]) for item in items]).astype(int)
    assert np.abs(batched - alone).max() <= 1  # float rounding of a batched matmul, at most one 8-bit level
    assert (batched == alone).mean() > 0.99
    assert np.abs(alone[0] - alone[1]).max() > 10  # two prompts and seeds: two different images


def test_the_folder_has_every_key_once_with_its_manifest_row(one_rank):
    out, summary = one_rank
    assert set(_files(out)) == {k.relpath for k in KEYS}
    table = read_manifest(out)
    assert len(table) == len(KEYS) and not table.duplicated(["prompt_id", "guidance", "seed"]).any()
    assert list(table["file"]) == [k.relpath for k in KEYS]  # sorted by key
    assert dict(zip(table["prompt_id"], table["caption"])) == {c.id: c.text for c in CAPTIONS}
    assert set(table["profile"]) == {"smoke"} and table["time_utc"].str.endswith("+00:00").all()
    assert summary.generated == len(KEYS) and summary.images_per_s > 0
    saved = json.loads((out / "summary.json").read_text())
    assert saved["generated"] == len(KEYS) and saved["ranks"][0]["images_per_s"] == summary.ranks[0].images_per_s


def test_two_shards_write_the_same_files_and_pixels_as_one_rank(smoke, tiny_pipe, one_rank, tmp_path):
    out, _ = one_rank
    shards = [generate_folder(smoke, CAPTIONS, tmp_path, GUIDANCE, rank=r, world_size=2, pipe=tiny_pipe,
                              progress=False) for r in (0, 1)]
    assert [s.generated for s in shards] == [3, 3]  # 6 single-image units, round robin
    assert _files(tmp_path) == _files(out)
    cols = ["prompt_id", "caption", "guidance", "seed", "file"]
    assert read_manifest(tmp_path)[cols].equals(read_manifest(out)[cols])
    assert sorted(read_manifest(tmp_path)["rank"]) == [0, 0, 0, 1, 1, 1]


def test_a_row_lost_to_a_kill_is_recovered_and_only_the_missing_image_is_made(smoke, tiny_pipe, one_rank, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(one_rank[0], out)
    part = out / "parts" / "rank-0.jsonl"
    lines = part.read_text().splitlines()
    part.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:25])  # killed mid-row: a torn last line
    lost_row = json.loads(lines[-1])["file"]
    missing = KEYS[0].relpath
    (out / missing).unlink()
    stale = out / (missing.replace("/", "/.") + ".abc123.tmp")  # a half-written image of the killed run
    stale.write_bytes(b"\x89PNG half")
    before = _stamps(out)
    summary = generate_folder(smoke, CAPTIONS, out, GUIDANCE, pipe=tiny_pipe, progress=False)
    assert (summary.generated, summary.ranks[0].rows_recovered) == (1, 1)
    assert not stale.exists()
    after = _stamps(out)
    assert {k: after[k] for k in before} == before, "an existing image was rewritten"
    assert _files(out) == _files(one_rank[0])
    table = read_manifest(out)
    assert sorted(table["file"]) == sorted(k.relpath for k in KEYS) and lost_row in set(table["file"])


def test_a_finished_folder_builds_no_model(smoke, one_rank, tmp_path, monkeypatch):
    out = tmp_path / "copy"
    shutil.copytree(one_rank[0], out)
    _no_model(monkeypatch)
    summary = generate_folder(smoke, CAPTIONS, out, GUIDANCE, progress=False)
    assert summary.generated == 0 and summary.ranks[0].already_done == len(KEYS)
    assert summary.images_per_s is None and "generated 0 images (6 planned)" in str(summary)


def test_two_launches_of_one_rank_into_one_folder_fail(smoke, tmp_path, monkeypatch):
    _no_model(monkeypatch)
    with store.ManifestPart(tmp_path, 0):
        with pytest.raises(ConfigError, match="locked by another process: a launch with rank 0"):
            generate_folder(smoke, CAPTIONS, tmp_path, GUIDANCE, progress=False)


def test_reading_a_folder_without_manifest_says_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="manifest.csv' does not exist: generate into"):
        read_manifest(tmp_path)


def test_two_launches_with_other_settings_racing_for_one_folder_exactly_one_proceeds(tmp_path):
    """run.json is created complete and exclusively: of two claims released together, one wins, one fails."""
    import threading

    for trial in range(20):
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        start, outcomes = threading.Barrier(2), []

        def claim(steps):
            start.wait()
            try:
                store.claim_run_settings(folder, {"profile": "smoke", "steps": steps})
                outcomes.append(("ok", steps))
            except ConfigError as exc:
                outcomes.append(("refused", str(exc)))

        threads = [threading.Thread(target=claim, args=(s,)) for s in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(o[0] for o in outcomes) == ["ok", "refused"], outcomes
        winner = next(o[1] for o in outcomes if o[0] == "ok")
        assert json.loads((folder / "run.json").read_text())["steps"] == winner
        assert "steps: folder has" in next(o[1] for o in outcomes if o[0] == "refused")
        assert [p.name for p in folder.iterdir()] == ["run.json"]  # no temp file left


def test_a_resume_with_other_captions_for_the_same_ids_is_refused(smoke, one_rank, tmp_path, monkeypatch):
    _no_model(monkeypatch)
    out = tmp_path / "copy"
    shutil.copytree(one_rank[0], out)
    other = [Caption(c.id, c.text + ", at night") for c in CAPTIONS]
    with pytest.raises(ConfigError, match="captions_sha256: folder has .*the captions differ"):
        generate_folder(smoke, other, out, GUIDANCE, progress=False)
    settings = json.loads((out / "run.json").read_text())  # a folder made before captions were hashed
    del settings["captions_sha256"]
    (out / "run.json").write_text(json.dumps(settings))
    with pytest.raises(ConfigError, match="caption id '(7|12|3)' was generated from '[a-z ]+', this run gives it"):
        generate_folder(smoke, other, out, GUIDANCE, progress=False)
    assert generate_folder(smoke, CAPTIONS, out, GUIDANCE, progress=False).generated == 0  # the same ones resume


def test_a_regenerated_image_gets_a_current_manifest_row(smoke, tiny_pipe, one_rank, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(one_rank[0], out)
    gone = KEYS[1].relpath
    old_row = read_manifest(out).set_index("file").loc[gone]
    (out / gone).unlink()
    assert generate_folder(smoke, CAPTIONS, out, GUIDANCE, pipe=tiny_pipe, progress=False).generated == 1
    table = read_manifest(out)
    assert len(table) == len(KEYS)
    assert table.set_index("file").loc[gone, "time_utc"] > old_row["time_utc"]


@pytest.mark.parametrize("file", ["../outside.png", "/etc/hostname", "g1.0/../../outside.png"])
def test_a_manifest_path_never_leaves_its_folder(one_rank, tmp_path, file):
    out = tmp_path / "copy"
    shutil.copytree(one_rank[0], out)
    (tmp_path / "outside.png").write_bytes(b"not ours")
    table = pd.read_csv(out / "manifest.csv", dtype=str, keep_default_na=False)
    table.loc[0, "file"] = file
    table.to_csv(out / "manifest.csv", index=False)
    with pytest.raises(ConfigError, match=r"names 1 file\(s\) outside its folder, e.g. '" + file.replace(".", r"\.")):
        read_manifest(out)


def test_a_guidance_folder_that_is_a_file_fails_before_any_model(smoke, tmp_path, monkeypatch):
    _no_model(monkeypatch)
    (tmp_path / "g1.0").write_text("in the way")
    with pytest.raises(ConfigError, match=r"g1\.0' is not a folder, but images or manifest rows go there"):
        generate_folder(smoke, CAPTIONS, tmp_path, GUIDANCE, progress=False)


def test_an_image_regenerated_by_a_killed_run_gets_its_row_recovered(smoke, tiny_pipe, one_rank, tmp_path,
                                                                       monkeypatch):
    """Deleted, regenerated, killed before its row: the old row describes a file that is gone; the next run
    writes the row from the new file's time instead of keeping the stale one."""
    import os
    import time

    out = tmp_path / "copy"
    shutil.copytree(one_rank[0], out)
    again = KEYS[2].relpath
    old_time = read_manifest(out).set_index("file").loc[again, "time_utc"]
    later = time.time() + 30
    os.utime(out / again, (later, later))  # as if written again after its row
    _no_model(monkeypatch)
    summary = generate_folder(smoke, CAPTIONS, out, GUIDANCE, progress=False)
    assert (summary.generated, summary.ranks[0].rows_recovered) == (0, 1)
    row = read_manifest(out).set_index("file").loc[again]
    assert row["time_utc"] > old_time and row["time_utc"] == store.utc_from_unix(later)
