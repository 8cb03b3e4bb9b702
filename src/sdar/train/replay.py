"""Composer channel 3 inside `sdar train`: each step's frozen trajectories go to the N-teacher pool in
the background; the DPO pairs it returns enter the loss one step later (off the critical path).

A pair is one turn: chosen = the action at least `min_agree` teachers agreed on, as the policy would
write it; rejected = the student's own sampled response. Both are scored after the student's prompt
ids, under the same allowed-token renormalisation as the student when decoding is constrained.
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sdar.agent.constrained import action_trie
from sdar.agent.parsing import format_action
from sdar.console import make_console


@dataclass
class PairSet:
    """Tokenised DPO pairs, one entry per pair; ref_* are the frozen reference's summed log-probs [P]."""

    prompts: list[list[int]] = field(default_factory=list)
    chosen: list[list[int]] = field(default_factory=list)
    rejected: list[list[int]] = field(default_factory=list)
    chosen_allowed: list[list[list[int]] | None] = field(default_factory=list)
    rejected_allowed: list[list[list[int]] | None] = field(default_factory=list)
    meta: list[dict[str, Any]] = field(default_factory=list)
    ref_chosen: torch.Tensor | None = None
    ref_rejected: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    def to_records(self) -> list[dict[str, Any]]:
        """JSON-able lines (what the teacher_replay component hands gated_train)."""
        out = []
        for i in range(len(self)):
            out.append({**self.meta[i], "prompt_ids": self.prompts[i], "chosen_ids": self.chosen[i],
                        "rejected_ids": self.rejected[i], "chosen_allowed": self.chosen_allowed[i],
                        "rejected_allowed": self.rejected_allowed[i]})
        return out

    @classmethod
    def from_records(cls, records: list[dict[str, Any]]) -> "PairSet":
        ps = cls()
        for r in records:
            missing = [k for k in ("prompt_ids", "chosen_ids", "rejected_ids") if k not in r]
            if missing:
                raise ValueError(f"a replay pair record lacks {missing}: training reads tokenised pairs, which the "
                                 "teacher_replay pipeline step writes (`write_pair_set`); `sdar teachers replay` "
                                 "files hold the votes only")
            ps.prompts.append(list(r["prompt_ids"]))
            ps.chosen.append(list(r["chosen_ids"]))
            ps.rejected.append(list(r["rejected_ids"]))
            ps.chosen_allowed.append(r.get("chosen_allowed"))
            ps.rejected_allowed.append(r.get("rejected_allowed"))
            ps.meta.append({k: v for k, v in r.items() if not k.endswith(("_ids", "_allowed"))})
        return ps

    def extend(self, other: "PairSet") -> None:
        for name in ("prompts", "chosen", "rejected", "chosen_allowed", "rejected_allowed", "meta"):
            getattr(self, name).extend(getattr(other, name))
        self.ref_chosen = self.ref_rejected = None


def write_pair_set(pairs: PairSet, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for rec in pairs.to_records():
            f.write(json.dumps(rec) + "\n")
    return path


def read_pair_set(path: str | Path) -> PairSet:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no replay pairs at {path}; run the teacher_replay step (or `sdar teachers replay`)")
    return PairSet.from_records([json.loads(line) for line in path.read_text().splitlines() if line.strip()])


def tokenise_pairs(pairs, trajs, tokenizer, family: str, constrained: bool) -> PairSet:
    """`sdar.replay.ReplayPair`s over `trajs` as token ids: the student's prompt, the agreed action written
    as the policy writes actions (`format_action` + <|im_end|>), and the student's sampled response."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = PairSet()
    for p in pairs:
        turn = trajs[p.traj].turns[p.turn]
        chosen = list(tokenizer(format_action(family, p.chosen), add_special_tokens=False)["input_ids"]) + [eos]
        allowed = None
        if constrained and turn.allowed is not None and turn.view.admissible_actions:
            if p.chosen not in turn.view.admissible_actions:
                continue  # constrained decoding could never write it: no gradient signal to give
            allowed = action_trie(tokenizer, family, turn.view.admissible_actions, eos).allowed_along(chosen)
        out.prompts.append(list(turn.prompt_ids))
        out.chosen.append(chosen)
        out.rejected.append(list(turn.response_ids))
        out.chosen_allowed.append(allowed)
        out.rejected_allowed.append(turn.allowed)
        out.meta.append({"task_id": trajs[p.traj].task_id, "traj": p.traj, "turn": p.turn, "chosen": p.chosen,
                         "rejected": p.rejected, "agree": p.agree, "teachers": p.teachers})
    return out


class ReplayChannel:
    """The teacher pool, its background worker and the pairs waiting for the next step.

    cfg: `sdar.replay.ReplayConfig`. With no teachers configured, the local pool (`sdar teachers serve`:
    this family's rule experts, plus any `local_policies`) is started on 127.0.0.1 and used.
    lag: 1 = pairs from step k enter the loss at step k+1 (the replay overlaps the step's scoring and
    update); 0 = wait for them in the same step.
    """

    def __init__(self, cfg, *, family: str, builder, tokenizer, constrained: bool, out_dir: Path, console,
                 lag: int = 1) -> None:
        import contextlib

        from sdar.replay.server import open_teacher_pool

        if lag not in (0, 1):
            raise ValueError(f"replay.lag={lag} must be 0 (same step) or 1 (next step)")
        self.cfg, self.family, self.builder, self.tokenizer = cfg, family, builder, tokenizer
        self.constrained, self.lag, self.console = constrained, lag, console
        if not cfg.teachers:
            console.print("[cyan]replay: no teacher pool configured (replay.teachers): starting the local pool "
                          f"(`sdar teachers serve`) on 127.0.0.1 with rule experts {', '.join(cfg.local_experts)}"
                          + (f" and policies {', '.join(cfg.local_policies)}" if cfg.local_policies else "")
                          + "[/cyan]")
        self._stack = contextlib.ExitStack()
        self.pool = self._stack.enter_context(open_teacher_pool(cfg, family, cache_dir=out_dir / "replay-cache"))
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="teacher-replay")
        self._queue: list[Future] = []
        self.last_stats: dict[str, float] = {}
        self._replayed = 0  # trajectories replayed so far (the worker's count, in step order)

    def _build(self, trajs) -> tuple[PairSet, dict[str, float]]:
        from sdar.replay import build_pairs

        pairs, stats = build_pairs(trajs, self.pool, self.builder, self.family, min_agree=self.cfg.min_agree)
        self._replayed += len(trajs)
        stats["replay/trajectories"] = float(len(trajs))
        # the pool's cumulative cost at this replay's end, over the trajectories replayed by then
        stats["replay/cost_per_trajectory_usd"] = stats.get("replay/cost_usd", 0.0) / self._replayed
        return tokenise_pairs(pairs, trajs, self.tokenizer, self.family, self.constrained), stats

    def submit(self, trajs) -> None:
        """Queue this step's frozen trajectories for replay (one worker: replays run in step order)."""
        self._queue.append(self._worker.submit(self._build, trajs))

    def take(self) -> PairSet | None:
        """The pairs due in this step's loss: the previous step's replay (lag 1; None at the first step)
        or this step's own (lag 0). Waits for that replay if it is still running."""
        if len(self._queue) <= self.lag:
            return None
        pairs, self.last_stats = self._queue.pop(0).result()
        return pairs

    def pending(self) -> list[tuple[PairSet, dict[str, float]]]:
        """The replays whose pairs no step has taken yet, waiting for any still running: what a checkpoint keeps, so
        that a resumed run takes them where the straight run would."""
        return [f.result() for f in self._queue]

    def restore(self, entries: list[tuple[PairSet, dict[str, float]]]) -> None:
        """Queue replays a checkpoint kept (`pending`), ahead of any new one."""
        done = []
        for entry in entries:
            f: Future = Future()
            f.set_result(entry)
            done.append(f)
        self._queue = done + self._queue

    @property
    def replayed(self) -> int:
        """Trajectories replayed so far (the denominator of replay/cost_per_trajectory_usd)."""
        return self._replayed

    def metrics(self) -> dict[str, float]:
        """Accounting for MLflow: the pool's cumulative calls, tokens, cost and latency, and the turns, agreement
        and pairs of the replay whose pairs this step took (its snapshot of the pool's figures wins)."""
        out = {**self.pool.stats(), **self.last_stats}
        out.setdefault("replay/cost_per_trajectory_usd", out.get("replay/cost_usd", 0.0) / max(self._replayed, 1))
        return out

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
        self._stack.close()  # the pool, and the local pool's server when this channel started one


def replay_trajectories(runtime, trajs, *, out_dir, console=None) -> tuple[PairSet, dict[str, float]]:
    """Replay `trajs` once with the pool of `runtime.cfg.replay` (what the DAG's teacher_replay step does):
    the tokenised DPO pairs and the pool's accounting. runtime: an `sdar.train.runtime.Runtime`."""
    from pathlib import Path

    channel = ReplayChannel(runtime.cfg.replay, family=runtime.cfg.env.family, builder=runtime.builder,
                            tokenizer=runtime.tokenizer, constrained=runtime.rollout_cfg.constrained,
                            out_dir=Path(out_dir), console=console or make_console(stderr=True), lag=0)
    try:
        channel.submit(trajs)
        pairs = channel.take() or PairSet()
        return pairs, channel.metrics()
    finally:
        channel.close()
