"""Dynamic sampling (rollout.filter_groups, DAPO's filter_groups in verl) and the groups/* metrics every run logs.

The real trainer on the tiny model for what a run does; for which groups the filter keeps, trajectories with chosen
rewards handed to the trainer's own selection (`_filtered`), since a real policy's outcomes cannot be chosen."""

import dataclasses

import pytest

from sdar.agent.rollout import Trajectory, Turn
from sdar.config.compat import drop_added_defaults
from sdar.train.trainer import _flat_groups

from .conftest import make_trainer, small_config


def _turn(format_valid: bool = True) -> Turn:
    return Turn(view=None, prompt_ids=[1], response_ids=[2], response_text="", action="look", valid=True,
                env_valid=True, reward=0.0, format_valid=format_valid)


def _group(g: int, wins: list[bool], task: str = "t", bad_format: int = -1) -> list[Trajectory]:
    """One task's rollouts: rollout i won when wins[i]; rollout `bad_format`'s turn has no well-formed action."""
    return [Trajectory(task_id=f"{task}{g}", task_type="x", group=g, skills="", won=w,
                       turns=[_turn(format_valid=i != bad_format), _turn()]) for i, w in enumerate(wins)]


def test_a_group_is_flat_when_every_turn_sample_gets_advantage_zero(tiny_ckpt, tmp_path):
    trainer = make_trainer(small_config(tmp_path, tracking=False))
    trajs = (_group(0, [True, True]) + _group(1, [False, True]) + _group(2, [False, False])
             + _group(3, [False, False], bad_format=1) + [Trajectory("t4", "x", 4, "")])
    # 0 and 2: equal rewards; 3 lost twice but one rollout paid the format penalty; 4 has no turn-samples
    batch, advantages = trainer._grpo(trajs)
    assert _flat_groups(trajs, batch.groups, advantages) == {0, 2, 4}


def test_every_run_counts_the_groups_that_carry_no_advantage(tiny_ckpt, tmp_path):
    cfg = small_config(tmp_path, tracking=False, tasks_per_step=3, group_size=2, steps=2)
    trainer = make_trainer(cfg)
    trajs, counts = trainer.collect_groups(0)
    assert counts.rolled == 3 and counts.flat == counts.flat_trained
    batch, advantages = trainer._grpo(trajs)
    assert counts.flat == len(_flat_groups(trajs, batch.groups, advantages))
    assert [tr.task_id for tr in trajs] == trainer.sample_tasks(0)[0]  # unfiltered: the step's tasks, in order
    hist = trainer.run()["history"]
    for h in hist:
        assert h["groups/rolled_out"] == 3
        assert h["groups/zero_std_frac"] == pytest.approx(h["groups/zero_std_trained"] / 3)
    assert hist[0]["groups/zero_std_trained"] == counts.flat  # the same draw: the step's seed


def test_an_unfiltered_rollout_phase_computes_the_advantages_once(tiny_ckpt, tmp_path):
    trainer = make_trainer(small_config(tmp_path, tracking=False, tasks_per_step=2, group_size=2))
    calls, grpo = [], trainer._grpo
    trainer._grpo = lambda trajs: calls.append(len(trajs)) or grpo(trajs)
    r = trainer.rollout_phase(0)
    assert calls == [4]  # once, over the step's 2 x 2 rollouts (collect returns them uncounted)
    assert r.groups.rolled == 2
    assert r.groups.flat == len(_flat_groups(r.trajs, r.batch.groups, r.advantages))


def test_later_draws_take_tasks_no_earlier_draw_took(tiny_ckpt, tmp_path):
    trainer = make_trainer(small_config(tmp_path, tracking=False, tasks_per_step=3))
    draws = [trainer.sample_tasks(5, d)[0][::trainer.cfg.group_size] for d in range(4)]
    assert draws[0] == trainer.sample_tasks(5)[0][::trainer.cfg.group_size]
    assert len({t for d in draws for t in d}) == 12  # the pool has enough: no task twice in a step
    assert draws == [trainer.sample_tasks(5, d)[0][::trainer.cfg.group_size] for d in range(4)]  # outcome-free


@pytest.mark.parametrize("found, max_draws, want_draws", [
    ([[1, 0], [0, 0], [1, 0], [1, 1]], 4, 3),  # one group moved in draw 0, none in draw 1, one in draw 2
    ([[0, 0], [0, 0], [0, 0], [0, 0]], 4, 4),  # none ever moved: filled with equal-reward groups
    ([[1, 1], [1, 1]], 4, 1),  # every group moved at once: one draw
    ([[0, 1], [0, 1]], 1, 1),  # one draw allowed
])
def test_the_filter_keeps_the_first_groups_whose_rewards_differ(tiny_ckpt, tmp_path, found, max_draws, want_draws):
    """found[d][g] = 1 when draw d's group g (of two) has rewards that differ."""
    cfg = small_config(tmp_path, tracking=False, tasks_per_step=2, group_size=2)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, filter_groups=True,
                                                               filter_max_draws=max_draws))
    trainer = make_trainer(cfg)
    played = []

    def play(step, draw, mine):
        played.append(draw)
        return [tr for g in mine for tr in _group(g, [True, not found[draw][g]], task=f"d{draw}-")]

    trainer._play = play
    trajs, counts = trainer.collect_groups(0)
    assert played == list(range(want_draws))
    varied = [f"d{d}-{g}" for d in range(want_draws) for g in range(2) if found[d][g]]
    flat = [f"d{d}-{g}" for d in range(want_draws) for g in range(2) if not found[d][g]]
    kept = (varied + flat)[:2]
    assert [tr.task_id for tr in trajs] == [t for t in kept for _ in range(2)]
    assert [tr.group for tr in trajs] == [0, 0, 1, 1]  # renumbered as this rank's groups
    assert counts.rolled == 2 * want_draws and counts.flat == len(flat)
    assert counts.flat_trained == max(0, 2 - len(varied))


def test_a_filtered_run_trains_on_the_groups_that_move(tiny_ckpt, tmp_path):
    cfg = small_config(tmp_path, tracking=False, tasks_per_step=2, group_size=2, steps=2,
                       **{"rollout.filter_groups": True, "rollout.filter_max_draws": 3})
    trainer = make_trainer(cfg)
    hist = trainer.run()["history"]
    for h in hist:
        assert 2 <= h["groups/rolled_out"] <= 6 and h["groups/rolled_out"] % 2 == 0
        flat = round(h["groups/zero_std_frac"] * h["groups/rolled_out"])
        varied = h["groups/rolled_out"] - flat
        # the draws stop once two groups moved; short of that every group that moved is trained
        assert h["groups/zero_std_trained"] == max(0, 2 - varied)
        assert h["groups/rolled_out"] == 6 or varied >= 2


def test_the_filter_is_outside_every_identity_until_it_is_on(tmp_path):
    base = dataclasses.asdict(small_config(tmp_path))
    assert "filter_groups" not in drop_added_defaults(base)["rollout"]
    assert "filter_max_draws" not in drop_added_defaults(base)["rollout"]
    more = dataclasses.asdict(small_config(tmp_path, **{"rollout.filter_max_draws": 9}))
    assert drop_added_defaults(more) == drop_added_defaults(base)  # inert while the filter is off
    on = dataclasses.asdict(small_config(tmp_path, **{"rollout.filter_groups": True}))
    assert drop_added_defaults(on)["rollout"]["filter_groups"] is True
    assert "filter_max_draws" not in drop_added_defaults(on)["rollout"]  # at its default, as every added field
    six = dataclasses.asdict(small_config(tmp_path, **{"rollout.filter_groups": True, "rollout.filter_max_draws": 6}))
    assert drop_added_defaults(six)["rollout"]["filter_max_draws"] == 6
