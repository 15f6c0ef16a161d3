"""Image keys, file names and the split between ranks: stable, complete, disjoint, independent of launch order."""
from __future__ import annotations

import random

import pytest

from sdperf.core.errors import ConfigError
from sdperf.imagegen import keys as K
from sdperf.imagegen import ranks as R


def test_every_key_once_sorted_by_guidance_then_id_then_seed():
    keys = K.plan_keys(["b", "a", "b"], [7.5, 1.5, 7.5], [1, 0])
    assert len(keys) == 2 * 2 * 2 == len(set(keys))
    assert keys == sorted(keys) and keys[0] == K.ImageKey(1.5, "a", 0) and keys[-1] == K.ImageKey(7.5, "b", 1)


def test_without_seeds_each_prompt_gets_its_own_seed_at_every_guidance_scale():
    keys = K.plan_keys(["b", "a", "c"], [2.0, 8.0], base_seed=10)
    assert {(k.prompt_id, k.seed) for k in keys} == {("b", 10), ("a", 11), ("c", 12)}
    assert len(keys) == 6


@pytest.mark.parametrize("prompt_id", ["123", "a/b", "..", ".hidden", "x_s1", "naïve caption id", "50%", "a b"])
def test_file_names_are_safe_and_give_back_their_key(prompt_id):
    key = K.ImageKey(7.5, prompt_id, 3)
    folder, name = key.relpath.split("/")
    assert folder == "g7.5" and not name.startswith(".") and "/" not in name
    assert K.parse_relpath(key.relpath) == key


def test_ids_that_differ_never_share_a_file():
    ids = ["a", "a_s1", "a/b", "a%2Fb", "A", "a b", "a+b", ".a", "%2Ea"]
    names = {k.relpath for k in K.plan_keys(ids, [2.0], [0, 1, 11])}
    assert len(names) == len(ids) * 3


def test_an_id_too_long_for_a_file_name_fails_before_any_work():
    with pytest.raises(ConfigError, match="too long to name a file"):
        K.plan_keys(["x" * 300], [2.0], [0])


def test_units_hold_one_guidance_scale_and_do_not_depend_on_input_order():
    ids = [str(i) for i in range(7)]
    keys = K.plan_keys(ids, [1.5, 8.0], [0])
    units = K.work_units(keys, 3)
    assert [len(u) for u in units] == [3, 3, 1, 3, 3, 1]
    assert all(len({k.guidance for k in u}) == 1 for u in units)
    shuffled = ids[:]
    random.Random(1).shuffle(shuffled)
    assert K.work_units(K.plan_keys(shuffled, [8.0, 1.5], [0]), 3) == units


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_shards_cover_every_unit_once_and_are_balanced(world_size):
    units = K.work_units(K.plan_keys([str(i) for i in range(11)], [1.5, 3.0], [0, 1]), 2)
    shards = [K.shard(units, r, world_size) for r in range(world_size)]
    flat = [u for s in shards for u in s]
    assert sorted(flat) == sorted(units) and len(flat) == len(set(flat))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("bad", ["abc", 0.5, -2, float("nan"), float("inf"), True])
def test_bad_guidance_names_the_value_and_what_is_valid(bad):
    with pytest.raises(ConfigError) as err:
        K.check_guidance([7.5, bad])
    assert repr(bad) in str(err.value) and ">= 1" in str(err.value)


def test_no_guidance_or_seed_and_bad_seed_fail():
    with pytest.raises(ConfigError, match="at least one scale"):
        K.check_guidance([])
    with pytest.raises(ConfigError, match="seed -1 is not valid"):
        K.check_seeds([0, -1])
    with pytest.raises(ConfigError, match="batch size 0 is not valid"):
        K.work_units([], 0)


def test_rank_comes_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert R.detect() == R.Ranks(3, 4, 1, 2)
    assert R.detect(rank=0, world_size=1).rank == 0


@pytest.mark.parametrize("env, message", [({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
                                          ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 / world size 2 is not valid")])
def test_bad_rank_environment_is_named(monkeypatch, env, message):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=message):
        R.detect()
