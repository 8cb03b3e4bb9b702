"""Voting and DPO pair building (ALGORITHM.md section 5, channel 3) with a stubbed 3-teacher pool."""

from __future__ import annotations

import pytest

from sdar.agent.prompts import PromptBuilder, TurnView
from sdar.agent.rollout import Trajectory, Turn
from sdar.replay import ReplayPair, build_pairs, read_pairs, vote, write_pairs
from sdar.replay.pairs import teacher_action

ACTIONS = ["go to desk 1", "go to shelf 2", "open drawer 1", "look"]


# ---- vote ------------------------------------------------------------------------------------------
def test_vote_plurality_min_agree_ties_and_normalisation():
    assert vote(["go to desk 1", "Go to  DESK 1", "look"], 2) == ("go to desk 1", 2)
    assert vote(["a", "b", "c"], 2) == (None, 1)  # all disagree
    assert vote(["a", "a", "b", "b"], 2) == (None, 2)  # a tie at the top is no agreement
    assert vote(["a", "a", "a", "b", "b"], 2) == ("a", 3)
    assert vote([None, None, "a"], 2) == (None, 1)  # failed teachers cast no vote
    assert vote([None, "", None], 2) == (None, 0)
    assert vote(["a"], 1) == ("a", 1)
    with pytest.raises(ValueError, match="min_agree must be >= 1"):
        vote(["a"], 0)


def test_teacher_action_parses_and_checks_admissibility():
    assert teacher_action("<think>desk</think><action>go to desk 1</action>", "household", ACTIONS) == "go to desk 1"
    assert teacher_action("<action>Go to  Desk 1</action>", "household", ACTIONS) == "go to desk 1"  # list spelling
    assert teacher_action("go to desk 1", "household", ACTIONS) is None  # invalid format: no vote
    assert teacher_action("<action>fly away</action>", "household", ACTIONS) is None  # not admissible
    assert teacher_action(None, "household", ACTIONS) is None
    assert teacher_action("<search>capital of peru</search>", "searchqa", []) == "<search>capital of peru</search>"


# ---- build_pairs ---------------------------------------------------------------------------------------
class StubPool:
    """Three teachers whose replies are scripted per observation (no HTTP: the pool has its own tests)."""

    def __init__(self, script: dict[str, list[str | None]]) -> None:
        self.script = script
        self.endpoints = ["t1", "t2", "t3"]
        self.seen: list[list[dict]] = []

    def propose(self, messages):
        self.seen.extend(messages)
        out = []
        for m in messages:
            obs = next(line[5:] for line in m[-1]["content"].splitlines() if line.startswith("Now: "))
            out.append(self.script[obs])
        return out

    def stats(self):
        return {"replay/calls": 3.0 * len(self.seen)}


def act(a: str) -> str:
    return f"<action>{a}</action>"


def turn(obs: str, action: str, step: int = 0, dropped: int = 0) -> Turn:
    view = TurnView(task="put a mug on desk", step=step, max_steps=10, observation=obs, admissible_actions=ACTIONS,
                    history=[(f"old {i}", "look") for i in range(3)])
    return Turn(view=view, prompt_ids=[1, 2, step], response_ids=[7, 8, step], response_text=act(action),
                action=action, valid=True, env_valid=True, reward=0.0, history_dropped=dropped)


SCRIPT = {
    # 2 teachers agree on X = go to desk 1, the student took Y = look: one pair
    "disagree": [act("go to desk 1"), act("go to shelf 2"), act("go to desk 1")],
    # all agree with the student: none
    "agree": [act("look"), act("look"), act("look")],
    # all three disagree: none
    "split": [act("go to desk 1"), act("go to shelf 2"), act("open drawer 1")],
    # the student already took the agreed X: none
    "student_x": [act("open drawer 1"), "<action>Open  drawer 1</action>", None],
    # agreement by two, but one reply is an invalid format and another inadmissible: no pair
    "invalid": ["go to desk 1", act("go to desk 1"), act("teleport")],
}


def test_build_pairs_from_a_three_teacher_disagreement():
    trajs = [
        Trajectory("household/t0", "pick", 0, skills="S",
                   turns=[turn("disagree", "look", 0), turn("agree", "look", 1)]),
        Trajectory("household/t1", "pick", 0, skills="S", turns=[turn("split", "look", 0),
                                                                  turn("student_x", "open drawer 1", 1),
                                                                  turn("invalid", "look", 2)]),
    ]
    pool = StubPool(SCRIPT)
    pairs, stats = build_pairs(trajs, pool, PromptBuilder("household", history=2), "household", min_agree=2)
    assert pairs == [ReplayPair(traj=0, turn=0, chosen="go to desk 1", rejected="look", agree=2, teachers=3,
                                task_id="household/t0", prompt_ids=[1, 2, 0], rejected_ids=[7, 8, 0])]
    assert stats["replay/turns"] == 5
    assert stats["replay/agreement_rate"] == pytest.approx(3 / 5)  # disagree, agree, student_x
    assert stats["replay/pairs"] == 1 and stats["replay/pairs_per_trajectory"] == 0.5
    assert stats["replay/student_agrees_rate"] == pytest.approx(2 / 3)
    assert stats["replay/teacher_valid_rate"] == pytest.approx((3 + 3 + 3 + 2 + 1) / 15)
    assert stats["replay/calls"] == 15  # the pool's own stats ride along


def test_min_agree_three_needs_all_three():
    trajs = [Trajectory("t", "pick", 0, skills="", turns=[turn("disagree", "look"), turn("agree", "open drawer 1")])]
    pairs, stats = build_pairs(trajs, StubPool(SCRIPT), PromptBuilder("household"), "household", min_agree=3)
    assert [(p.chosen, p.rejected, p.agree) for p in pairs] == [("look", "open drawer 1", 3)]
    assert stats["replay/agreement_rate"] == 0.5


def test_teachers_see_exactly_the_students_context():
    builder = PromptBuilder("household", history=2)
    t = turn("disagree", "look", step=4, dropped=1)  # the student's prompt kept 1 of 2 history pairs
    pool = StubPool(SCRIPT)
    build_pairs([Trajectory("t", "pick", 0, skills="SECRET SKILLS", turns=[t])], pool, builder, "household")
    assert pool.seen == [builder.messages(t.view, history=1)]
    text = pool.seen[0][1]["content"]
    assert "old 2" in text and "old 1" not in text and "SECRET SKILLS" not in text
    assert "Admissible actions: go to desk 1, go to shelf 2, open drawer 1, look" in text


def test_no_trajectories_no_calls():
    pool = StubPool(SCRIPT)
    pairs, stats = build_pairs([], pool, PromptBuilder("household"), "household")
    assert pairs == [] and pool.seen == [] and stats["replay/turns"] == 0 and stats["replay/agreement_rate"] == 0


# ---- the JSONL a pipeline passes --------------------------------------------------------------------------
def test_write_and_read_pairs_round_trip(tmp_path):
    pairs = [ReplayPair(0, 1, "go to desk 1", "look", 2, 3, "household/t0", [1, 2], [3, 4]),
             ReplayPair(2, 0, "<answer>lima</answer>", "<search>peru</search>", 3, 3, "searchqa/x", [5], [6])]
    path = write_pairs(tmp_path / "out" / "pairs.jsonl", pairs)
    assert read_pairs(path) == pairs
    import json

    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"traj", "turn", "task_id", "chosen", "rejected", "agree", "teachers", "prompt_ids",
                          "rejected_ids"}
    path.write_text(path.read_text() + '{"traj": 1, "turn": 0, "oops": 1}\n')
    with pytest.raises(ValueError, match=r"pairs.jsonl:3: not a replay pair \(unknown field\(s\) \['oops'\]"):
        read_pairs(path)
