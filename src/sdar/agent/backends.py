"""Generation backends behind one interface: transformers `generate` (CPU default, KV cache)
and vLLM (GPU; import-guarded, loads the current LoRA adapter per step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Generation:
    """One sampled response: its token ids (ending with EOS when it finished), text, and
    whether it finished before the token limit."""

    token_ids: list[int]
    text: str
    finished: bool


class GenerationBackend(Protocol):
    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float = 1.0,
        tries: list | None = None,
    ) -> list[Generation]:
        """tries: optional per-prompt `ActionTrie` restricting the response to admissible actions."""
        ...


def _eos_ids(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return sorted(i for i in ids if i is not None)


class TransformersBackend:
    """Batched sampling with `model.generate` and its KV cache; prompts are left-padded.

    batch_size bounds memory: prompts are generated in chunks of this many.
    """

    def __init__(self, model, tokenizer, batch_size: int = 64) -> None:
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.eos_ids = _eos_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens, temperature, top_p=1.0, tries=None):
        out: list[Generation] = []
        was_training = self.model.training
        self.model.eval()
        tries = tries or [None] * len(prompts)
        try:
            for start in range(0, len(prompts), self.batch_size):
                sl = slice(start, start + self.batch_size)
                out.extend(self._generate_chunk(prompts[sl], max_new_tokens, temperature, top_p, tries[sl]))
        finally:
            self.model.train(was_training)
        return out

    def _generate_chunk(self, prompts, max_new_tokens, temperature, top_p, tries):
        width = max(len(p) for p in prompts)
        device = next(self.model.parameters()).device
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        sample = temperature > 0
        # top_k=0: no top-k truncation (generation configs default to 50), so tokens come from
        # exactly the distribution the trainer scores
        kwargs = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if sample else dict(do_sample=False)
        if any(t is not None for t in tries):
            from transformers import LogitsProcessorList

            from sdar.agent.constrained import TrieLogitsProcessor

            kwargs["logits_processor"] = LogitsProcessorList([TrieLogitsProcessor(list(tries), width)])
        seqs = self.model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_ids, pad_token_id=self.pad_id, use_cache=True, **kwargs,
        )
        gens = []
        for row in seqs[:, width:].tolist():
            cut = next((j for j, t in enumerate(row) if t in self.eos_ids), None)
            toks = row if cut is None else row[: cut + 1]
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            gens.append(Generation(toks, text, cut is not None))
        return gens


class VLLMBackend:
    """vLLM engine for GPU rollouts. `load_adapter(dir)` makes the next calls use a new LoRA
    adapter (one per RL step) without reloading the base weights."""

    def __init__(self, model_path: str, tokenizer, *, dtype: str = "bfloat16", max_lora_rank: int = 16,
                 gpu_memory_utilization: float = 0.35, enable_lora: bool = True, **engine_kwargs) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:  # pragma: no cover - exercised on GPU machines only
            raise ImportError(
                "the vLLM backend needs vllm on a CUDA machine: pip install -e '.[gpu]'; "
                "use generation_backend='transformers' on CPU"
            ) from exc
        self.tokenizer = tokenizer
        self.eos_ids = _eos_ids(tokenizer)
        self.llm = LLM(model=model_path, dtype=dtype, enable_lora=enable_lora, max_lora_rank=max_lora_rank,
                       gpu_memory_utilization=gpu_memory_utilization, **engine_kwargs)
        self._lora = None
        self._lora_version = 0

    def load_adapter(self, adapter_dir: str) -> None:  # pragma: no cover - GPU only
        from vllm.lora.request import LoRARequest

        self._lora_version += 1
        self._lora = LoRARequest(f"policy-{self._lora_version}", self._lora_version, adapter_dir)

    def generate(self, prompts, *, max_new_tokens, temperature, top_p=1.0, tries=None):  # pragma: no cover - GPU only
        from vllm import SamplingParams, TokensPrompt

        if tries and any(t is not None for t in tries):
            raise NotImplementedError("constrained decoding is not wired to vLLM yet (guided choice); "
                                      "set rollout.constrained=false or use the transformers backend")
        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                stop_token_ids=self.eos_ids, skip_special_tokens=True)
        results = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                    lora_request=self._lora, use_tqdm=False)
        gens = []
        for r in results:
            o = r.outputs[0]
            toks = list(o.token_ids)
            gens.append(Generation(toks, o.text, o.finish_reason == "stop"))
        return gens
