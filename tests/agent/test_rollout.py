"""sdar.agent.rollout.TurnBatch: a step's turn-samples flattened once, row i of every [B, T] tensor."""

from __future__ import annotations

import torch

from sdar.agent.prompts import TurnView
from sdar.agent.rollout import Trajectory, Turn, TurnBatch


def _turn(prompt: list[int], response: list[int], allowed=None) -> Turn:
    view = TurnView(task="t", step=0, max_steps=5, observation="o")
    return Turn(view=view, prompt_ids=prompt, response_ids=response, response_text="", action="a", valid=True,
                env_valid=True, reward=0.0, allowed=allowed)


def test_rows_follow_trajectory_order_with_their_group_and_task():
    a = Trajectory("task-a", "pick", 0, "skills a", turns=[_turn([1], [2, 3]), _turn([1, 4], [5])])
    empty = Trajectory("task-b", "pick", 0, "skills b")
    c = Trajectory("task-c", "heat", 1, "skills c", turns=[_turn([7, 8, 9], [6, 6, 6, 6], allowed=[[6]] * 4)])
    batch = TurnBatch.of([a, empty, c])
    assert len(batch) == 3
    assert batch.prompts == [[1], [1, 4], [7, 8, 9]]
    assert batch.responses == [[2, 3], [5], [6, 6, 6, 6]]
    assert batch.allowed == [None, None, [[6]] * 4]
    assert batch.groups == [0, 0, 1] and batch.task_ids == ["task-a", "task-a", "task-c"]
    assert batch.traj_of_row == [0, 0, 2]
    assert batch.trajectory_rows() == [range(0, 2), range(2, 2), range(2, 3)]
    assert batch.turns[2] is c.turns[0]  # the rows are the trajectories' own turns, not copies
    assert torch.equal(batch.response_mask(), torch.tensor([[1.0, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]))


def test_an_empty_batch_has_no_rows():
    batch = TurnBatch.of([Trajectory("t", "x", 0, "")])
    assert len(batch) == 0 and batch.prompts == [] and batch.response_mask().shape == (0, 0)
