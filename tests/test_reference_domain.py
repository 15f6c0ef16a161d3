"""The reference domain: deterministic scenes, captions that say everything, renders that show it, exact labels,
and the adherence rule that turns an evaluator's reading into a score."""
from __future__ import annotations

import numpy as np
import pytest

from sdperf.refmodel import domain, evaluator
from sdperf.refmodel.domain import Scene, Thing


def test_a_scene_is_a_function_of_seed_and_index_alone():
    assert domain.scene(5, 17) == domain.scene(5, 17) == domain.scenes(5, 3, start=16)[1]
    assert domain.scenes(5, 40) != domain.scenes(6, 40)
    np.testing.assert_array_equal(domain.render(domain.scene(5, 17), 32), domain.render(domain.scene(5, 17), 32))


def test_captions_say_every_attribute_and_the_domain_has_thousands_of_them():
    s = Scene((Thing("circle", "red", "small", 0), Thing("square", "blue", "large", 3)), "dark")
    assert s.caption == ("a small red circle at the top left and a large blue square at the bottom right "
                         "on a dark background")
    assert len(domain.attributes(s)) == 4 * 2 + 2
    assert domain.distinct_captions() == 7104
    seen = {x.caption for x in domain.scenes(0, 3000)}
    assert len(seen) > 1500  # varied (one-object scenes have 192 captions, so some repeat), not a handful
    assert set(" ".join(seen).split()) <= set(domain.vocabulary())


def test_render_puts_the_colour_in_the_named_quadrant_and_the_background_elsewhere():
    s = Scene((Thing("square", "red", "large", 1),), "light")  # top right
    img = domain.render(s, 32).astype(int)
    assert img.shape == (32, 32, 3) and img.dtype == np.int64
    centre, empty = img[8, 24], img[24, 8]
    np.testing.assert_allclose(centre, domain.COLOURS["red"], atol=2)
    np.testing.assert_allclose(empty, domain.BACKGROUNDS["light"], atol=2)
    small = Scene((Thing("square", "red", "small", 1),), "light")
    coloured = lambda im: (np.abs(im.astype(int) - domain.BACKGROUNDS["light"]).sum(-1) > 60).sum()  # noqa: E731
    assert coloured(domain.render(small, 32)) < 0.5 * coloured(img)


def test_labels_mark_each_quadrant_and_ignore_colour_where_nothing_is():
    s = Scene((Thing("triangle", "yellow", "small", 2),), "dark")
    lab = domain.labels(s)
    assert lab.tolist() == [0, -1, -1, 0, -1, -1, 3, 3, 0, 0, -1, -1, 1]


def _truth(*things, background="light"):
    return domain.labels(Scene(tuple(things), background))


def test_adherence_counts_each_claim_and_a_missing_object_fails_all_of_its_claims():
    a, b = Thing("circle", "red", "small", 0), Thing("square", "blue", "large", 3)
    truth = _truth(a, b)
    assert evaluator.adherence_checks(truth, truth)[0] == 1.0
    wrong_colour = _truth(Thing("circle", "green", "small", 0), b)
    assert evaluator.adherence_checks(wrong_colour, truth)[0] == pytest.approx(9 / 10)
    missing = _truth(a)  # b absent: its 4 claims and the count fail
    assert evaluator.adherence_checks(missing, truth)[0] == pytest.approx(5 / 10)
    extra = _truth(a, b, Thing("circle", "red", "small", 1))  # everything named is there, one too many
    assert evaluator.adherence_checks(extra, truth)[0] == pytest.approx(9 / 10)
    dark = _truth(a, b, background="dark")
    assert evaluator.adherence_checks(dark, truth)[0] == pytest.approx(9 / 10)


def test_accuracy_reports_each_head_and_whole_scenes():
    items = domain.scenes(1, 50)
    truth = domain.labels_many(items)
    acc = evaluator.accuracy(truth, truth)
    assert acc == {"shape": 1.0, "colour": 1.0, "size": 1.0, "background": 1.0, "adherence": 1.0, "scene": 1.0}
    off = truth.copy()
    off[:, -1] = 1 - off[:, -1]
    worse = evaluator.accuracy(off, truth)
    assert worse["background"] == 0.0 and worse["scene"] == 0.0 and worse["shape"] == 1.0


def test_evaluator_rejects_a_resolution_it_cannot_pool_and_images_of_the_wrong_type():
    with pytest.raises(ValueError, match="multiple of 16"):
        evaluator.Evaluator(40)
    with pytest.raises(ValueError, match="uint8"):
        evaluator.to_input(np.zeros((1, 32, 32, 3), dtype=np.float32))
