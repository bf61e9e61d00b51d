"""DimensionScheduler: EMA by hand, hint lists on a hand-made sequence, exact state round trip."""

from __future__ import annotations

import json

import pytest

from score_lightning.harness.scheduler import DimensionScheduler

POOL = ["a", "b", "c", "d"]

# (rubric dims, per-query consistencies) -> with decay 0.5:
#  1 [a,b] mean 1.0 : a=1.0  b=1.0
#  2 [a,c] mean 0.8 : a=0.9            c=0.8
#  3 [b,c] mean 0.0 :        b=0.5     c=0.4
#  4 [a,c] mean 0.0 : a=0.45           c=0.2
#  5 [a,b] mean 1.0 : a=0.725 b=0.75
SEQUENCE = [(["a", "b"], [1.0, 1.0]), (["a", "c"], [0.6, 1.0]), (["b", "c"], [0.0]),
            (["a", "c"], [0.0, 0.0]), (["a", "b"], [1.0])]


def run(sched: DimensionScheduler, seq=SEQUENCE) -> DimensionScheduler:
    for dims, cons in seq:
        sched.update_stats(dims, cons)
    return sched


def hand_scheduler(**kw) -> DimensionScheduler:
    params = dict(ema_decay=0.5, min_count_required=2, required_threshold=0.6, avoid_threshold=0.2,
                  explore_below_count=2, max_hints=2)
    params.update(kw)
    return DimensionScheduler(POOL, **params)


def test_ema_values_by_hand() -> None:
    s = run(hand_scheduler())
    assert s.ema == pytest.approx({"a": 0.725, "b": 0.75, "c": 0.2, "d": None})
    assert s.count == {"a": 4, "b": 3, "c": 3, "d": 0}
    d = DimensionScheduler(POOL)  # default decay 0.8: first observation initialises, then 0.8*old + 0.2*new
    d.update_stats(["a"], [0.5])
    assert d.ema["a"] == 0.5
    d.update_stats(["a"], [1.0, 0.0, 0.5])
    assert d.ema["a"] == pytest.approx(0.8 * 0.5 + 0.2 * 0.5)
    d.update_stats(["a"], [1.0])
    assert d.ema["a"] == pytest.approx(0.8 * 0.5 + 0.2 * 1.0)


def test_hints_on_hand_sequence() -> None:
    s = run(hand_scheduler())
    assert s.required() == ["b", "a"]  # best first, not pool order
    assert s.avoided() == ["c"]  # threshold inclusive: c == 0.2
    assert s.explore() == ["d"]
    assert s.frequencies() == pytest.approx({"a": 0.8, "b": 0.6, "c": 0.6, "d": 0.0})
    wide = run(hand_scheduler(explore_below_count=4))
    assert wide.explore() == ["b", "c"]  # pool order, capped at max_hints (d would be third)


def test_min_count_gates_required_and_avoided() -> None:
    s = hand_scheduler(min_count_required=2)
    s.update_stats(["a", "b"], [1.0])
    s.update_stats(["c"], [0.0])
    assert s.required() == [] and s.avoided() == []  # one lucky (or unlucky) step is not enough
    s.update_stats(["a", "c"], [1.0])
    assert s.required() == ["a"] and s.avoided() == []  # c: 0.5*0 + 0.5*1 = 0.5, neither


def test_max_hints_caps_required_best_first() -> None:
    s = hand_scheduler(min_count_required=1)
    s.update_stats(["a", "b", "c"], [0.7])
    s.update_stats(["c"], [1.0])  # c: 0.85
    s.update_stats(["b"], [0.8])  # b: 0.75
    assert s.required() == ["c", "b"]


def test_duplicates_unknown_and_nonfinite_inputs() -> None:
    s = hand_scheduler()
    s.update_stats(["a", "a", "zzz"], [1.0, float("nan")])
    assert s.count["a"] == 1 and s.ema["a"] == 1.0 and "zzz" not in s.ema
    s.update_stats(["b"], [])  # no consistency: selection counts, EMA does not move
    assert s.selected["b"] == 1 and s.count["b"] == 0 and s.ema["b"] is None
    assert s.frequencies() == {"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0}
    assert DimensionScheduler(POOL).frequencies() == {d: 0.0 for d in POOL}


def test_state_round_trip_is_exact_and_json_serialisable() -> None:
    s = run(hand_scheduler())
    text = json.dumps(s.state_dict())
    t = hand_scheduler()
    t.load_state_dict(json.loads(text))
    assert t.state_dict() == s.state_dict()
    assert (t.required(), t.avoided(), t.explore()) == (s.required(), s.avoided(), s.explore())
    s.update_stats(["d", "a"], [0.3])
    t.update_stats(["d", "a"], [0.3])
    assert t.state_dict() == s.state_dict()


def test_load_with_changed_pool_keeps_known_dims() -> None:
    s = run(hand_scheduler())
    t = DimensionScheduler(["b", "e"], ema_decay=0.5)
    t.load_state_dict(s.state_dict())
    assert t.ema == {"b": pytest.approx(0.75), "e": None} and t.count == {"b": 3, "e": 0} and t.steps == 5


def test_set_pool_follows_a_pool_edit() -> None:
    s = run(hand_scheduler())  # a=0.725 (4 obs), b=0.75 (3), c=0.2 (3), d never chosen
    s.set_pool(["e", "b", "c"])  # the harness dropped a and d, added e
    assert s.pool == ["e", "b", "c"] and s.steps == 5
    assert s.ema == {"e": None, "b": pytest.approx(0.75), "c": pytest.approx(0.2)}
    assert s.count == {"e": 0, "b": 3, "c": 3} and s.selected == {"e": 0, "b": 3, "c": 3}
    assert s.required() == ["b"] and s.avoided() == ["c"] and s.explore() == ["e"]  # a is gone from every hint
    assert s.frequencies() == pytest.approx({"e": 0.0, "b": 0.6, "c": 0.6})
    s.update_stats(["e", "a"], [1.0])  # a is no longer in the pool: ignored
    assert s.ema["e"] == 1.0 and "a" not in s.ema and s.steps == 6
    # a checkpoint taken after the edit restores into a scheduler that follows the same edit
    t = hand_scheduler()
    t.set_pool(["e", "b", "c"])
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert t.state_dict() == s.state_dict()
    s.set_pool(["a", "b"])  # a comes back without its old statistics
    assert s.ema["a"] is None and s.count["a"] == 0 and s.count["b"] == 3
    with pytest.raises(ValueError, match="at least one"):
        s.set_pool([])


@pytest.mark.parametrize("kw", [{"ema_decay": 1.0}, {"ema_decay": -0.1}, {"min_count_required": 0},
                                {"avoid_threshold": 0.9, "required_threshold": 0.5}])
def test_invalid_parameters(kw: dict) -> None:
    with pytest.raises(ValueError):
        DimensionScheduler(POOL, **kw)
    with pytest.raises(ValueError):
        DimensionScheduler([])
