"""Imitation of the families' experts: the expert turns a warm start learns from, rendered with exactly the
rollout's prompts, and the supervised loop (negative log-likelihood of the expert's response) that fits a policy
to them. The tiny model's warm start (`sdar.train.warmstart`) and a pretrained checkpoint's
(`sdar.train.warm_pretrained`) both build on these."""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import replace
from typing import Any

import torch
from sdar_envs import make_env
from sdar_envs.household.env import BACKEND_OPTIONS
from sdar_envs.shop import pages as shop_pages

from sdar.agent.constrained import action_trie
from sdar.agent.parsing import format_action
from sdar.agent.prompts import PromptBuilder, fit_prompt_ids
from sdar.agent.rollout import EpisodeState
from sdar.config import TrainConfig
from sdar.models.scoring import response_logprobs
from sdar.progress import Progress


def warmstart_config(cfg: TrainConfig) -> TrainConfig:
    """The config the tiny warm start is built from (and keyed by): household always imitates the
    sim's experts, whatever backend plays the episodes.

    The engine has neither the sim's uninformed (listing-order) expert nor its skills-following one,
    so a warm start on it would give the teacher no edge, and the sim speaks the engine's exact
    text. So `backend: alfworld` (train or evaluate on the official games) keeps the cached
    sim-trained model: the backend, the other backend's options and the eval split (which never
    shapes a warm start) are left out; a sim config maps to itself.
    """
    if cfg.env.family != "household":
        return cfg

    foreign = {k for b, opts in BACKEND_OPTIONS.items() if b != "sim" for k in opts} - set(BACKEND_OPTIONS["sim"])
    kwargs = {k: v for k, v in cfg.env.kwargs.items() if k not in foreign}
    train_split = cfg.env.train_split
    if kwargs.get("backend", "sim") != "sim":
        kwargs["backend"] = "sim"
        train_split = train_split if train_split in ("train", "test") else "train"
    env = replace(cfg.env, kwargs=kwargs, train_split=train_split, eval_split="test")
    return cfg if env == cfg.env else replace(cfg, env=env)


def expert_turns(cfg: TrainConfig, episodes: int, seed: int, progress: str | None = None,
                 console=None) -> list[dict[str, Any]]:
    """Expert turns with the views the rollout would build: [{view, action, skills, privileged}].

    With `warmstart.noise` > 0 some turns execute a random admissible action instead (DART); those
    turns are not in the result, the expert's turns after them are. progress: show the episodes under this
    label (`sdar.progress`).
    """
    cfg = warmstart_config(cfg)
    rng = random.Random(seed)
    env = make_env(cfg.env.family, **cfg.env.kwargs)
    pool = env.task_ids(cfg.env.train_split)
    noise = cfg.warmstart.noise
    if cfg.warmstart.decision_repeats < 1:
        raise ValueError(f"warmstart.decision_repeats={cfg.warmstart.decision_repeats} must be >= 1 (1 = no repeats)")
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"warmstart.noise={noise} must be in [0, 1): the probability of a random action per expert turn")
    out = []
    shown = Progress(progress, episodes, "episodes", console=console) if progress else contextlib.nullcontext()
    with shown:
        for _ in range(episodes):
            out.extend(_expert_episode(env, cfg, rng, pool, noise))
            if progress:
                shown.advance()
    env.close()
    return out


def _expert_episode(env, cfg: TrainConfig, rng: random.Random, pool: list[str], noise: float) -> list[dict[str, Any]]:
    """One expert episode's imitated turns."""
    rc, out = cfg.rollout, []
    privileged = rng.random() < cfg.warmstart.privileged_fraction
    first = env.reset(task_id=rng.choice(pool))
    state = EpisodeState(first, cfg.env.family, rc.use_memory, env.task_text)
    skills = env.privileged_skills()
    for turn in range(rc.max_turns):
        if state.done:
            break
        expert = getattr(env, "skilled_expert_action" if privileged else "uninformed_expert_action",
                         env.expert_action)
        action = expert()
        view = state.view(turn, rc.max_turns)
        if noise and view.admissible_actions and rng.random() < noise:
            action = rng.choice(view.admissible_actions)  # a perturbation: executed, not imitated
        else:
            out.append({"view": view, "action": action, "skills": skills, "privileged": privileged})
        state.advance(action, env.step(action))
    return out


# the shop's clicks that are not option values (on the item page: not results either)
_SHOP_BUTTONS = frozenset(f"click[{b}]" for b in shop_pages.BUTTONS)


def is_decision(turn: dict[str, Any], family: str = "household") -> bool:
    """Turns that decide an episode. Household: `take`, and `go to` anywhere but the memory's
    "Search next: go to X" (to an appliance, the target, a seen object). Shop: clicking an option value
    on the item page (the value the instruction names must be copied from it; a tiny model got 36% right)."""
    if family == "shop":
        return turn["view"].observation.endswith(shop_pages.SEP + shop_pages.BUY_NOW) and turn["action"] not in _SHOP_BUTTONS
    action, memory = turn["action"], turn["view"].memory or ""
    if action.startswith("take "):
        return True
    return action.startswith("go to ") and f"Search next: {action}." not in memory


def prompt_fingerprint(cfg: TrainConfig) -> str:
    """The rendered prompts of a few expert turns: any change to prompt or memory wording (code, not
    config) changes the warm start's cache key, so a stale model is never reused silently."""
    builder = PromptBuilder(cfg.env.family, history=cfg.rollout.history, show_admissible=cfg.rollout.show_admissible)
    turns = expert_turns(cfg, 2, seed=cfg.seed + 4242)
    return json.dumps([builder.messages(t["view"], skills=t["skills"] if t["privileged"] else None)
                       for t in turns[:8]] + [format_action(cfg.env.family, t["action"]) for t in turns[:8]])


def sft_examples(cfg: TrainConfig, tokenizer, builder: PromptBuilder, turns: list[dict[str, Any]],
                 constrained: bool | None = None) -> list[tuple[list[int], list[int], list | None]]:
    """The SFT's examples of expert `turns` (from `expert_turns`): (prompt ids, response ids + eos, the allowed
    tokens along the response or None), decisions repeated `warmstart.decision_repeats` times. constrained: give the
    allowed tokens (the loss is then the choice among admissible actions, as constrained decoding samples); None =
    cfg.rollout.constrained, False = none (the full vocabulary's likelihood: what free sampling needs)."""
    cfg = warmstart_config(cfg)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    examples = []
    for t in turns:
        limit = cfg.teacher.max_prompt_tokens if t["privileged"] else cfg.rollout.max_prompt_tokens
        ids, _ = fit_prompt_ids(tokenizer, builder, t["view"], limit, skills=t["skills"] if t["privileged"] else None,
                                placement=cfg.rollout.privileged_placement)
        resp = tokenizer(format_action(cfg.env.family, t["action"]), add_special_tokens=False)["input_ids"] + [eos]
        allowed = None
        if (cfg.rollout.constrained if constrained is None else constrained) and t["view"].admissible_actions:
            # imitate the choice among admissible actions: the same constrained distribution
            # the policy samples from, so no capacity goes into spelling actions
            allowed = action_trie(tokenizer, cfg.env.family, t["view"].admissible_actions, eos).allowed_along(resp)
        examples.extend([(ids, resp, allowed)] * (cfg.warmstart.decision_repeats if is_decision(t, cfg.env.family) else 1))
    return examples


def sft_batches(lengths: list[int], batch_size: int, g: torch.Generator) -> list[list[int]]:
    """One epoch's batches (example indices, in the order they run) for examples of these lengths: a random
    permutation cut into windows of 16 batches, each window sorted by length (student and privileged prompts
    differ a lot: far less padding), cut into batches, and the batches shuffled. Draws from `g`."""
    order = torch.randperm(len(lengths), generator=g).tolist()
    window = batch_size * 16
    order = [i for w in range(0, len(order), window) for i in sorted(order[w : w + window], key=lengths.__getitem__)]
    batches = [order[k : k + batch_size] for k in range(0, len(order), batch_size)]
    return [batches[b] for b in torch.randperm(len(batches), generator=g).tolist()]


def sft(model, examples: list[tuple[list[int], list[int], list | None]], *, pad_id: int, epochs: int, lr: float,
        batch_size: int, seed: int, console=None, prompt_lm: float = 0.0) -> dict[str, float]:
    """Negative log-likelihood of the response tokens (prompts are context); examples with
    allowed-token lists use the constrained distribution, as the policy does when it acts."""
    params = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapter; else every weight
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    steps = epochs * ((len(examples) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 20) * max(0.05, 1 - i / max(steps, 1)))
    model.train()
    losses = []
    with Progress("warm start: SFT", steps, "updates", console=console) as progress:
        lengths = [len(p) + len(r) for p, r, _ in examples]
        for _ in range(epochs):
            for batch in sft_batches(lengths, batch_size, g):
                rows = [examples[i] for i in batch]
                # one padded forward per batch: the batches are length-sorted already (3% padding), and regrouping
                # changes float summation order, which over ~600 updates moved a demo-size warm start from 17.5% to
                # 4.2% of 120 held-out tasks; this keeps the warm start every README figure was measured with
                scored = response_logprobs(model, [p for p, _, _ in rows], [r for _, r, _ in rows], pad_id=pad_id,
                                           grad=True, allowed=[a for _, _, a in rows], prompt_lm=prompt_lm > 0,
                                           length_buckets=False)
                loss = -(scored.logp * scored.mask).sum() / scored.mask.sum().clamp(min=1.0)
                if prompt_lm > 0 and scored.prompt_tokens:
                    # language modelling on the prompts (observations, memory, lists) from the
                    # same forward: far more signal per update, so a model trained from scratch
                    # learns to read and copy from its context in fewer updates
                    loss = loss - prompt_lm * scored.prompt_logp_sum / scored.prompt_tokens
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                sched.step()
                losses.append(loss.item())
                progress.advance()
    model.eval()
    tail = losses[-20:] or [float("nan")]
    return {"sft_first_loss": losses[0] if losses else float("nan"), "sft_final_loss": sum(tail) / len(tail),
            "sft_updates": len(losses)}
