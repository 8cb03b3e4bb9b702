"""Shared fixtures for the model layer: an agent-style corpus, a small trained tokenizer, a small tiny-model config."""

from __future__ import annotations

import random

import pytest
import yaml

from sdar.models import TinyModelConfig, train_tokenizer

# small enough that a forward/backward takes milliseconds; same architecture as the default
SMALL_CFG = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 256,
}


def agent_corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Household-style observations and tagged agent replies."""
    rng = random.Random(seed)
    objs = ["cabinet", "countertop", "drawer", "fridge", "sinkbasin", "shelf", "microwave", "toaster"]
    items = ["apple", "mug", "knife", "plate", "bread", "egg", "spoon", "lettuce"]
    lines = []
    for _ in range(n):
        seen = ", ".join(f"a {rng.choice(objs)} {rng.randint(1, 9)}" for _ in range(5))
        item, obj = rng.choice(items), rng.choice(objs)
        lines.append(f"You are in the middle of a room. Looking quickly around you, you see {seen}.")
        lines.append(f"Your task is to: put a clean {item} in {obj}.")
        lines.append(
            f"<think>I need the {item}; it may be in the {obj}.</think><action>go to {obj} {rng.randint(1, 9)}</action>"
        )
        lines.append(f"<search>where is the {item}</search><information>The {item} is on the {obj}.</information>")
        lines.append(f"<answer>{item}</answer>")
    return lines


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(agent_corpus(), vocab_size=512)


@pytest.fixture(scope="session")
def small_cfg() -> TinyModelConfig:
    return TinyModelConfig(**SMALL_CFG)


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory, tokenizer):
    """A saved tokenizer with a small tiny-qwen2.yaml beside it: what `tiny:<dir>` loads."""
    d = tmp_path_factory.mktemp("tok")
    tokenizer.save_pretrained(d)
    (d / "tiny-qwen2.yaml").write_text(yaml.safe_dump(SMALL_CFG))
    return d
