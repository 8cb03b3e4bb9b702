"""The multi-turn rollout loop: many sessions stepped in lock-step so the model generates
for every live episode at once, recording each turn as a training sample."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from sdar.agent.backends import GenerationBackend
from sdar.agent.constrained import action_trie
from sdar.agent.memory import memory_for
from sdar.agent.parsing import parse_response
from sdar.agent.prompts import PromptBuilder, TurnView, fit_prompt_ids
from sdar.config import PENALIZE, REWARDS, RolloutConfig  # noqa: F401 - re-exported
from sdar_envs.base import privileged_skills_for


@dataclass
class Turn:
    """One turn-sample: the prompt the student saw and the response it sampled."""

    view: TurnView
    prompt_ids: list[int]
    response_ids: list[int]
    response_text: str
    action: str
    valid: bool  # the response parsed and its action was admissible
    env_valid: bool  # the environment accepted the action
    reward: float  # the environment's reward for this step
    error_kind: str | None = None
    hint_template_key: str | None = None
    error_args: dict | None = None  # what the hint template is filled with (observed names, the action)
    history_dropped: int = 0
    allowed: list[list[int]] | None = None  # constrained decoding: allowed tokens per response position
    format_valid: bool = True  # the response held a well-formed action block (what the reference penalises)
    logprobs: list[float] | None = None  # the sampler's log-prob per response token (backends that give it)


@dataclass
class Trajectory:
    task_id: str
    task_type: str
    group: int  # index of the task within the step; the G rollouts of a task share it
    skills: str  # the privileged text of this task (what the teacher sees)
    turns: list[Turn] = field(default_factory=list)
    won: bool = False
    reward: float = 0.0  # the episode's reward: sum of step rewards

    @property
    def length(self) -> int:
        return len(self.turns)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id, "task_type": self.task_type, "group": self.group, "won": self.won,
            "reward": self.reward, "length": self.length,
            "turns": [
                {"observation": t.view.observation, "response": t.response_text, "action": t.action,
                 "valid": t.valid, "env_valid": t.env_valid, "reward": t.reward, "error_kind": t.error_kind}
                for t in self.turns
            ],
        }


@dataclass
class TurnBatch:
    """A set of trajectories' turn-samples, flattened once in trajectory order: row i is `turns[i]`, the row
    every [B, T] tensor of a step (old_logp, ref_logp, teacher_logp, mask, advantages) is indexed by."""

    trajectories: list[Trajectory]
    turns: list[Turn]
    traj_of_row: list[int]  # row -> index of its trajectory

    @classmethod
    def of(cls, trajectories: list[Trajectory]) -> TurnBatch:
        rows = [(k, t) for k, tr in enumerate(trajectories) for t in tr.turns]
        return cls(list(trajectories), [t for _, t in rows], [k for k, _ in rows])

    def __len__(self) -> int:
        return len(self.turns)

    @property
    def prompts(self) -> list[list[int]]:
        return [t.prompt_ids for t in self.turns]

    @property
    def responses(self) -> list[list[int]]:
        return [t.response_ids for t in self.turns]

    @property
    def allowed(self) -> list[list[list[int]] | None]:
        return [t.allowed for t in self.turns]

    @property
    def groups(self) -> list[int]:
        """Per row, the task group (the G rollouts of a task share it): what GRPO normalises over."""
        return [self.trajectories[k].group for k in self.traj_of_row]

    @property
    def task_ids(self) -> list[str]:
        """Per row, its task: rows of a task share their prompt start (system prompt, task, skills)."""
        return [self.trajectories[k].task_id for k in self.traj_of_row]

    def trajectory_rows(self) -> list[range]:
        """Per trajectory, the range of its rows."""
        out, start = [], 0
        for tr in self.trajectories:
            out.append(range(start, start + len(tr.turns)))
            start += len(tr.turns)
        return out

    def response_mask(self):
        """Float [B, T] (T = longest response): 1 on every response token."""
        import torch

        T = max((len(t.response_ids) for t in self.turns), default=0)
        mask = torch.zeros(len(self.turns), T)
        for i, t in enumerate(self.turns):
            mask[i, : len(t.response_ids)] = 1.0
        return mask


class EpisodeState:
    """One live episode as the agent sees it: current observation, history, memory. Shared by
    the rollout loop and the warm-start data builder so both build identical prompts."""

    def __init__(self, first, family: str, use_memory: bool, task_text: str = "") -> None:
        self.obs, self.md = first.observation, first.metadata
        self.task = self.md.get("task") or task_text
        self.history: list[tuple[str, str]] = []
        self.mem = memory_for(family if use_memory else "none", self.task)
        self.mem.update(first.observation)
        self.done = bool(first.done)

    def view(self, turn: int, max_turns: int) -> TurnView:
        return TurnView(task=self.task, step=turn, max_steps=max_turns, observation=self.obs,
                        admissible_actions=list(self.md.get("admissible_actions") or []),
                        history=list(self.history), memory=self.mem.render())

    def advance(self, action: str, result) -> None:
        self.history.append((self.obs, action))
        self.obs, self.md = result.observation, result.metadata
        self.mem.update(result.observation)
        self.done = bool(result.done)


def rollout(
    backend: GenerationBackend,
    tokenizer,
    envs: list,
    task_ids: list[str],
    groups: list[int],
    cfg: RolloutConfig,
    progress: Callable[[int, int], None] | None = None,
    episode_seeds: list[int] | None = None,
) -> list[Trajectory]:
    """Play one episode per env (env i on task_ids[i]) in lock-step; returns trajectories.

    envs: TextEnv-like objects (in-process or remote clients), one per episode.
    progress: called after every turn with (turns played, episodes finished so far).
    episode_seeds: one seed per episode (an evaluation's common random numbers): episode i then samples from its own
    generator, so its draws do not depend on which other episodes are still running; None samples every turn from
    the global RNG (training rollouts, seeded per step).
    """
    builder = PromptBuilder(cfg.family, history=cfg.history, show_admissible=cfg.show_admissible)
    if episode_seeds is not None and len(episode_seeds) != len(envs):
        raise ValueError(f"{len(episode_seeds)} episode seeds for {len(envs)} episodes; pass one seed per episode")
    streams = None if episode_seeds is None else [torch.Generator().manual_seed(int(s)) for s in episode_seeds]
    pool = ThreadPoolExecutor(max_workers=max(1, cfg.env_workers))
    try:
        firsts = list(pool.map(lambda e_t: e_t[0].reset(task_id=e_t[1]), zip(envs, task_ids)))
        trajs, state = [], []
        for env, tid, g, first in zip(envs, task_ids, groups, firsts):
            skills = privileged_skills_for(env, cfg.family, first.metadata)
            trajs.append(Trajectory(tid, first.metadata.get("task_type", ""), g, skills=skills))
            state.append(EpisodeState(first, cfg.family, cfg.use_memory, getattr(env, "task_text", "")))
        for turn in range(cfg.max_turns):
            live = [i for i, s in enumerate(state) if not s.done]
            if not live:
                break
            views, prompts, dropped = [], [], []
            for i in live:
                view = state[i].view(turn, cfg.max_turns)
                skills = trajs[i].skills if cfg.skills_in_prompt else None
                ids, d = fit_prompt_ids(tokenizer, builder, view, cfg.max_prompt_tokens, skills=skills,
                                        placement=cfg.privileged_placement)
                views.append(view), prompts.append(ids), dropped.append(d)
            tries = None
            if cfg.constrained:
                eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
                tries = [action_trie(tokenizer, cfg.family, v.admissible_actions, eos) if v.admissible_actions
                         else None for v in views]
            own = {} if streams is None else {"seeds": [int(torch.randint(0, 2**62, (1,), generator=streams[i]))
                                                         for i in live]}
            gens = backend.generate(prompts, max_new_tokens=cfg.max_response_tokens,
                                    temperature=cfg.temperature, top_p=cfg.top_p, tries=tries, **own)
            parsed = [parse_response(g.text, cfg.family, v.admissible_actions, cfg.require_think)
                      for g, v in zip(gens, views)]
            results = list(pool.map(lambda ia: envs[ia[0]].step(ia[1].action), zip(live, parsed)))
            for j, (i, view, ids, d, gen, p, res) in enumerate(zip(live, views, prompts, dropped, gens, parsed, results)):
                md = res.metadata
                trie = tries[j] if tries else None
                trajs[i].turns.append(Turn(
                    view=view, prompt_ids=ids, response_ids=gen.token_ids, response_text=gen.text,
                    action=p.action, valid=p.valid and gen.finished, env_valid=bool(md.get("valid_action", True)),
                    reward=float(res.reward), error_kind=md.get("error_kind") or (None if p.valid else "format"),
                    hint_template_key=md.get("hint_template_key"), error_args=md.get("error_args"),
                    history_dropped=d,
                    allowed=trie.allowed_along(gen.token_ids) if trie is not None else None,
                    format_valid=p.valid_format and gen.finished,
                    logprobs=gen.logprobs,
                ))
                trajs[i].reward += float(res.reward)
                state[i].advance(p.action, res)
                if res.done:
                    trajs[i].won = bool(md.get("won", False))
            if progress:
                progress(turn + 1, sum(st.done for st in state))
    finally:
        pool.shutdown(wait=True)
    return trajs


# REWARDS (sdar.config): "reference": the reward the reference trains on (ZJU-REAL/SDAR agent_system/environments/env_package:
# alfworld/envs.py compute_reward = 10 * won; webshop/envs.py 10 when the WebShop score is 1, else 0;
# search/envs.py the exact-match reward as the environment gives it); "env": the environment's own reward
# (household 1 on a win, shop the continuous WebShop score, search exact match)
WIN_REWARD = {"household": 10.0, "shop": 10.0}


def episode_reward(traj: Trajectory, family: str, mode: str = "reference") -> float:
    """The trajectory's training reward under `mode` (see REWARDS)."""
    if mode not in REWARDS:
        raise ValueError(f"unknown reward {mode!r}; choose one of {', '.join(REWARDS)}")
    if mode == "reference" and family in WIN_REWARD:
        return WIN_REWARD[family] * float(traj.won)
    return traj.reward


def penalized(turn: Turn, penalize: str) -> bool:
    """Whether `turn` pays the invalid-action penalty (see RolloutConfig.penalize)."""
    if penalize == "format":
        return not turn.format_valid
    if penalize == "invalid":
        return not (turn.valid and turn.env_valid)
    raise ValueError(f"unknown penalize mode {penalize!r}; choose one of {', '.join(PENALIZE)}")


def turn_rewards(trajs: list[Trajectory], invalid_penalty: float, penalize: str = "format", family: str = "",
                 reward: str = "env") -> list[tuple[int, int, float]]:
    """(trajectory index, turn index, reward) per turn-sample: every turn gets its episode's
    reward (`episode_reward`), minus `invalid_penalty` on the turns `penalized` says."""
    out = []
    for ti, t in enumerate(trajs):
        r = episode_reward(t, family, reward)
        for k, turn in enumerate(t.turns):
            out.append((ti, k, r - (invalid_penalty if penalized(turn, penalize) else 0.0)))
    return out
