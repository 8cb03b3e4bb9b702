"""The model layer: tiny Qwen2 policy and local tokenizer, real checkpoints (SmolLM2, local, hub), LoRA,
the frozen reference, checkpoints, and the per-token log-probs the trainer feeds to `sdar.algos`.
"""

from sdar.models.chat_templates import (
    DEFAULT_SYSTEM,
    QWEN25_CHAT_TEMPLATE,
    QWEN25_DEFAULT_SYSTEM,
    chatml_template,
)
from sdar.models.gguf import convert_gguf, smollm2_dir, smollm2_gguf_path
from sdar.models.logprobs import position_ids_from_mask, token_logprobs
from sdar.models.policy import DEFAULT_LORA_TARGETS, ModelSpec, Policy, load_policy, resolve_name
from sdar.models.qwen import build_qwen_tokenizer, load_qwen_tokenizer
from sdar.models.tiny import TinyModelConfig, build_tiny_model, count_parameters
from sdar.models.tokenizer import AGENT_TAGS, SPECIAL_TOKENS, train_tokenizer

__all__ = [
    "AGENT_TAGS",
    "DEFAULT_LORA_TARGETS",
    "DEFAULT_SYSTEM",
    "QWEN25_CHAT_TEMPLATE",
    "QWEN25_DEFAULT_SYSTEM",
    "SPECIAL_TOKENS",
    "ModelSpec",
    "Policy",
    "TinyModelConfig",
    "build_qwen_tokenizer",
    "build_tiny_model",
    "chatml_template",
    "convert_gguf",
    "count_parameters",
    "load_policy",
    "load_qwen_tokenizer",
    "position_ids_from_mask",
    "resolve_name",
    "smollm2_dir",
    "smollm2_gguf_path",
    "token_logprobs",
    "train_tokenizer",
]
