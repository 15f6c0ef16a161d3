"""Captions: the three file formats, the seeded selection, and clear errors naming the path and what was expected."""
from __future__ import annotations

import json

import pytest

from sdperf.core.errors import ConfigError
from sdperf.model.prompts import Caption, load_captions, select, smoke_captions


def _coco(tmp_path, annotations, name="captions_val2014.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"info": {}, "annotations": annotations}))
    return path


def test_coco_json_keeps_one_caption_per_image_with_the_annotation_id(tmp_path):
    path = _coco(tmp_path, [
        {"id": 48, "image_id": 7, "caption": "A dog  on a\nsofa."},
        {"id": 12, "image_id": 7, "caption": "a brown dog lying down"},
        {"id": 30, "image_id": 9, "caption": "two cups of tea"},
    ])
    assert load_captions(path) == [Caption("12", "a brown dog lying down"), Caption("30", "two cups of tea")]
    every = load_captions(path, one_per_image=False)
    assert [c.id for c in every] == ["48", "12", "30"] and every[0].text == "A dog on a sofa."


def test_mlperf_tsv_reads_id_and_caption_columns(tmp_path):
    path = tmp_path / "captions_source.tsv"
    path.write_text("id\timage_id\tcaption\tfile_name\n"
                    "203564\t179765\ta bicycle by a wall\tx.jpg\n"
                    "322141\t190236\tan empty room\ty.jpg\n")
    assert load_captions(path) == [Caption("203564", "a bicycle by a wall"), Caption("322141", "an empty room")]


def test_plain_text_ids_are_line_numbers_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("first caption\n\n  third   caption \n")
    assert load_captions(path) == [Caption("1", "first caption"), Caption("3", "third caption")]


def test_smoke_set_is_ours_and_well_formed():
    caps = smoke_captions()
    assert len(caps) >= 30 and len({c.text for c in caps}) == len(caps)
    assert [c.id for c in caps] == [str(i) for i in range(1, len(caps) + 1)]


def test_select_is_seeded_without_replacement():
    caps = smoke_captions()
    a, b, c = select(caps, 10, seed=0), select(caps, 10, seed=0), select(caps, 10, seed=1)
    assert a == b and a != c
    assert len({x.id for x in a}) == 10 and set(a) <= set(caps)
    assert sorted(select(caps, len(caps), seed=3), key=lambda x: int(x.id)) == caps


def test_select_more_than_available_names_both_numbers():
    caps = smoke_captions()
    with pytest.raises(ConfigError) as err:
        select(caps, len(caps) + 5, seed=0)
    assert f"n={len(caps) + 5}" in str(err.value) and str(len(caps)) in str(err.value)
    with pytest.raises(ConfigError, match="n must be an integer >= 1"):
        select(caps, 0, seed=0)


def test_missing_file_names_the_path_and_the_expected_format(tmp_path):
    path = tmp_path / "nowhere" / "captions_val2014.json"
    with pytest.raises(ConfigError) as err:
        load_captions(path)
    assert str(path) in str(err.value) and "does not exist" in str(err.value) and "annotations" in str(err.value)


def test_unknown_format_lists_the_accepted_ones(tmp_path):
    path = tmp_path / "captions.csv"
    path.write_text("id,caption\n1,a cat\n")
    with pytest.raises(ConfigError) as err:
        load_captions(path)
    msg = str(err.value)
    assert str(path) in msg and "'.csv'" in msg and all(s in msg for s in (".json", ".tsv", ".txt"))


@pytest.mark.parametrize("name,content,problem", [
    ("empty.txt", "  \n", "is empty"),
    ("bad.json", "{not json", "is not valid JSON"),
    ("noann.json", json.dumps({"images": []}), "has no 'annotations' list"),
    ("nokey.json", json.dumps({"annotations": [{"id": 1, "caption": "x"}]}), "lacks one of"),
    ("noempty.json", json.dumps({"annotations": []}), "holds no captions"),
    ("nocol.tsv", "id\ttext\n1\ta cat\n", "lacks an 'id' or 'caption' column"),
    ("hole.tsv", "id\tcaption\n1\t\n", "line 2 has an empty id or caption"),
    ("dup.tsv", "id\tcaption\n1\ta\n1\tb\n", "occurs more than once"),
])
def test_malformed_files_name_the_path_and_the_problem(tmp_path, name, content, problem):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_captions(path)
    assert str(path) in str(err.value) and problem in str(err.value)
