"""Train on sdar's household environment with TRL's GRPOTrainer (see docs/trl.md).

    pip install -e '.[trl]'
    python examples/trl_grpo_household.py     # SmolLM2-135M-Instruct (converted offline), its own server, 3 steps
    python examples/trl_grpo_household.py --url http://127.0.0.1:8000 --model Qwen/Qwen2.5-0.5B-Instruct --steps 50

The episodes follow --config's `env` kwargs (for the server this script starts; with --url,
`sdar envs serve --env household --port 8000`, the server's own hold) and its `rollout` section, with
--max-turns and --history on top and `constrained` off (TRL cannot constrain decoding).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental in TRL 1.16

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from sdar.config import load_config  # noqa: E402
from sdar.integrations.trl import SdarEnvFactory, prepare_tokenizer  # noqa: E402


def load_model(name: str):
    """(model, tokenizer): "smollm2" = SmolLM2-135M-Instruct; else a local directory or hub id of a ChatML model."""
    if name == "smollm2":
        from sdar.models import smollm2_dir

        name = str(smollm2_dir())
    return AutoModelForCausalLM.from_pretrained(name), AutoTokenizer.from_pretrained(name, padding_side="left")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="sdar config for env kwargs and rollout (default: sdar's defaults)")
    p.add_argument("--url", help="a running household server; default: start one with --config's env kwargs")
    p.add_argument("--model", default="smollm2", help="smollm2 | a local directory | a hub id")
    p.add_argument("--max-turns", type=int, default=10, help="actions per episode (sdar's household default: 50)")
    p.add_argument("--history", type=int, default=0,
                   help="past pairs in each turn's text (TRL keeps the whole conversation anyway)")
    p.add_argument("--steps", type=int, default=3, help="GRPO steps")
    p.add_argument("--tasks", type=int, default=64, help="training tasks drawn from the train split")
    p.add_argument("--generations", type=int, default=4, help="rollouts per task (GRPO's group size)")
    p.add_argument("--max-completion-length", type=int, default=4096,
                   help="tokens of one whole episode: every reply and every next-turn prompt")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate")
    p.add_argument("--out", default="runs/trl-household", help="TRL's output directory")
    args = p.parse_args()

    cfg = load_config(args.config)
    rollout = dataclasses.replace(cfg.rollout, family="household", max_turns=args.max_turns, history=args.history,
                                  constrained=False)
    handle, url = None, args.url
    if url is None:
        from sdar_envs.launcher import serve_in_background

        url, handle = serve_in_background("household", **cfg.env.kwargs)
        print(f"household server at {url}")
    model, tokenizer = load_model(args.model)
    config = GRPOConfig(
        output_dir=args.out, max_steps=args.steps, num_generations=args.generations,
        per_device_train_batch_size=args.generations, max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=rollout.max_turns, temperature=rollout.temperature, learning_rate=args.lr,
        logging_steps=1, save_strategy="no", report_to="none", bf16=False,
    )
    try:
        with SdarEnvFactory(url, rollout, reward=cfg.reward) as factory:
            trainer = GRPOTrainer(
                model, args=config, processing_class=prepare_tokenizer(tokenizer, "household"),
                train_dataset=factory.task_dataset("train", n=args.tasks), environment_factory=factory,
            )
            trainer.train()
    finally:
        if handle is not None:
            handle.stop()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    print(f"\n{len(logs)} GRPO steps on household: mean reward {statistics.fmean(h['reward'] for h in logs):.3f}, "
          f"actions per episode {statistics.fmean(h['tools/call_frequency'] for h in logs):.1f}; "
          f"TRL's files: {Path(args.out).resolve()}")


if __name__ == "__main__":
    main()
