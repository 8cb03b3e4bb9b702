"""Supervised warm-start of the tiny default policy on expert trajectories.

The tokenizer is trained on environment text, the Qwen2-architecture model is built from
the repo's config, and it imitates expert turns rendered with exactly the rollout's prompts.
A share of the examples carries the privileged skills with the action of an expert that
follows exactly those skills (household: it searches the listed receptacle types first; search-QA:
it decomposes two-hop questions and searches both sides of a comparison), the rest has no skills and
the uninformed expert's action (household: listing-order search; search-QA: one search of the whole
question, then the bridge entity or the first-named entity as the answer), so
the skills-conditioned teacher can start out better than the student, as SDAR assumes. An
optional language-modelling term on the prompt tokens (`warmstart.prompt_lm_weight`) speeds
up learning to read the prompt. The result is cached by a hash of everything that shapes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from sdar.agent.constrained import action_trie
from sdar.agent.parsing import format_action
from sdar.agent.prompts import PromptBuilder, fit_prompt_ids
from sdar.agent.rollout import EpisodeState
from sdar.config import TrainConfig, drop_added_defaults
from sdar.models.scoring import response_logprobs
from sdar_envs.shop import pages as shop_pages

WARMSTART_VERSION = 7
MARKER = "warmstart.json"


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
    from sdar_envs.household.env import BACKEND_OPTIONS

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
    from sdar_envs import make_env

    from sdar.progress import Progress

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


def _prompt_fingerprint(cfg: TrainConfig) -> str:
    """The rendered prompts of a few expert turns: any change to prompt or memory wording (code, not
    config) changes the warm start's cache key, so a stale model is never reused silently."""
    builder = PromptBuilder(cfg.env.family, history=cfg.rollout.history, show_admissible=cfg.rollout.show_admissible)
    turns = expert_turns(cfg, 2, seed=cfg.seed + 4242)
    return json.dumps([builder.messages(t["view"], skills=t["skills"] if t["privileged"] else None)
                       for t in turns[:8]] + [format_action(cfg.env.family, t["action"]) for t in turns[:8]])


def _cache_key(cfg: TrainConfig, tiny) -> str:
    cfg = warmstart_config(cfg)  # the backend that plays the episodes does not shape the warm start
    blob = json.dumps({
        "prompts": hashlib.sha256(_prompt_fingerprint(cfg).encode()).hexdigest(),
        # where episodes are served (env.url) does not change what the warm start imitates
        "v": WARMSTART_VERSION, "env": {k: v for k, v in asdict(cfg.env).items() if k != "url"}, "warmstart": drop_added_defaults(asdict(cfg.warmstart), "warmstart"), "tiny": tiny.to_dict(),
        "rollout": {k: getattr(cfg.rollout, k) for k in ("history", "use_memory", "max_prompt_tokens", "max_turns", "constrained",
                                                          "show_admissible", "privileged_placement")},
        "teacher_max": cfg.teacher.max_prompt_tokens, "seed": cfg.seed,
    }, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_tiny_checkpoint(cfg: TrainConfig, out_dir: Path, console=None) -> dict[str, Any]:
    """Train tokenizer + tiny model on expert turns and save both to `out_dir`."""
    from sdar.models import build_tiny_model, train_tokenizer

    t0 = time.perf_counter()
    cfg = warmstart_config(cfg)
    ws = cfg.warmstart
    # the tokenizer needs plenty of text to learn merges (short prompts = cheap updates); the
    # SFT needs far fewer examples, so the two sample sizes are separate knobs
    turns = expert_turns(cfg, max(ws.episodes, ws.tokenizer_episodes), seed=cfg.seed,
                         progress="warm start: tokenizer's expert episodes", console=console)
    builder = PromptBuilder(cfg.env.family, history=cfg.rollout.history, show_admissible=cfg.rollout.show_admissible)
    corpus = []
    for t in turns:
        for skills in (None, t["skills"]):
            msgs = builder.messages(t["view"], skills=skills)
            corpus.append("\n".join(m["content"] for m in msgs) + "\n" + format_action(cfg.env.family, t["action"]))
    tokenizer = train_tokenizer(corpus, vocab_size=ws.vocab_size, pretokenizer=ws.pretokenizer)
    turns = expert_turns(cfg, ws.episodes, seed=cfg.seed + 1, progress="warm start: expert episodes", console=console)
    tiny = tiny_config(cfg)
    model = build_tiny_model(tokenizer, tiny)
    examples = sft_examples(cfg, tokenizer, builder, turns)
    # the SFT runs where the trainer would (cfg.device: a GPU when one is visible); saved from the CPU
    model.to(cfg.resolved_device())
    stats = sft(model, examples, pad_id=tokenizer.pad_token_id, epochs=ws.epochs, lr=ws.lr,
                batch_size=ws.batch_size, seed=cfg.seed, console=console, prompt_lm=ws.prompt_lm_weight)
    model.to("cpu").save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {"device": str(cfg.resolved_device()), "examples": len(examples), "privileged_examples": sum(t["privileged"] for t in turns),
            "episodes": ws.episodes, "seconds": time.perf_counter() - t0, **stats}
    (out_dir / MARKER).write_text(json.dumps(info, indent=2))
    return info


def sft_examples(cfg: TrainConfig, tokenizer, builder: PromptBuilder,
                 turns: list[dict[str, Any]]) -> list[tuple[list[int], list[int], list | None]]:
    """The SFT's examples of expert `turns` (from `expert_turns`): (prompt ids, response ids + eos, the allowed
    tokens along the response or None), decisions repeated `warmstart.decision_repeats` times."""
    cfg = warmstart_config(cfg)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    examples = []
    for t in turns:
        limit = cfg.teacher.max_prompt_tokens if t["privileged"] else cfg.rollout.max_prompt_tokens
        ids, _ = fit_prompt_ids(tokenizer, builder, t["view"], limit, skills=t["skills"] if t["privileged"] else None,
                                placement=cfg.rollout.privileged_placement)
        resp = tokenizer(format_action(cfg.env.family, t["action"]), add_special_tokens=False)["input_ids"] + [eos]
        allowed = None
        if cfg.rollout.constrained and t["view"].admissible_actions:
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
    from sdar.progress import Progress

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
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
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                losses.append(loss.item())
                progress.advance()
    model.eval()
    tail = losses[-20:] or [float("nan")]
    return {"sft_first_loss": losses[0] if losses else float("nan"), "sft_final_loss": sum(tail) / len(tail),
            "sft_updates": len(losses)}


def tiny_config(cfg: TrainConfig):
    """The repo's tiny-model config with the experiment's overrides applied."""
    from sdar.models import TinyModelConfig

    base = TinyModelConfig.from_yaml(None).to_dict()
    return TinyModelConfig.from_dict({**base, **cfg.model.tiny_overrides}, "model.tiny_overrides")


def tiny_checkpoint_path(cfg: TrainConfig) -> Path:
    """Where the warm-started tiny checkpoint of this config is cached (built or not)."""
    from sdar.models.cache import cache_root

    cfg = warmstart_config(cfg)
    return cache_root() / "tiny" / f"{cfg.env.family}-{_cache_key(cfg, tiny_config(cfg))}"


def tiny_checkpoint(cfg: TrainConfig, console=None) -> Path:
    """The cached warm-started tiny checkpoint for this config, built on first use."""
    from sdar.models.cache import build_once

    backend = cfg.env.kwargs.get("backend", "sim") if cfg.env.family == "household" else "sim"
    target = tiny_checkpoint_path(cfg)
    cfg = warmstart_config(cfg)
    if console is None and not (target / MARKER).is_file():  # a build takes minutes: it shows its progress
        from rich.console import Console

        console = Console(stderr=True)
    if backend != "sim" and console is not None:
        console.print(f"the tiny warm start imitates the household sim's experts; backend {backend!r} plays the episodes")
    if not (target / MARKER).is_file() and console is not None:
        console.print(f"building the warm-started tiny model (cached at {target}) ...")
    return build_once(target, lambda tmp: build_tiny_checkpoint(cfg, tmp, console), MARKER)


def ensure_warm_start(cfg: TrainConfig, console=None) -> Path | None:
    """The explicit warm-start step of a command: builds (or finds) the tiny model's warm start when
    cfg.model is "tiny"; other models need none (None)."""
    return tiny_checkpoint(cfg, console) if cfg.model.name_or_path == "tiny" else None


class WarmStartMissing(FileNotFoundError):
    """The config's tiny model has no warm start yet: it is built by its own step, never implicitly."""


def load_warm_policy(cfg: TrainConfig):
    """The policy for `cfg.model`, loaded: "tiny" is the cached warm-started checkpoint, which must have been
    built (`sdar warmstart --config ...`, or `ensure_warm_start`); anything else is loaded as named."""
    from sdar.models import ModelSpec, load_policy

    m = cfg.model
    path = m.name_or_path
    if path == "tiny":
        target = tiny_checkpoint_path(cfg)
        if not (target / MARKER).is_file():
            raise WarmStartMissing(
                f"the tiny model of this config has no warm start yet (expected at {target}); build it first with "
                "`sdar warmstart --config <your config>` (sdar train, sdar eval, sdar run and make demo build it "
                "themselves), or call sdar.train.warmstart.ensure_warm_start(cfg)")
        path = str(target)
    return load_policy(ModelSpec(name_or_path=path, dtype=m.dtype, lora=m.lora, lora_r=m.lora_r,
                                 lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                                 gradient_checkpointing=m.gradient_checkpointing))
