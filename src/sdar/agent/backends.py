"""Generation backends behind one interface: transformers `generate` (CPU default, KV cache) and
vLLM (GPU; import-guarded, serving the trainer's current LoRA adapter, re-exported when it changes)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from sdar.agent.decoding import DecodeStats, constrained_sample
from sdar.models.padding import padded

BACKENDS = ("transformers", "vllm")
GPU_INSTALL_HINT = "pip install -e '.[gpu]' on a CUDA machine (install a CUDA torch build first)"


@dataclass
class Generation:
    """One sampled response: its token ids (ending with EOS when it finished), text, and
    whether it finished before the token limit.

    logprobs: the sampler's log-prob of each token, or None. vLLM fills it (with
    `logprobs_mode='processed_logprobs'` these are of the distribution actually sampled: after the
    trie mask and temperature); transformers fills it with `record_logprobs=True`. Diagnostic only: the trainer
    recomputes `old_logp` with its own forward, so nothing in the update depends on it.
    """

    token_ids: list[int]
    text: str
    finished: bool
    logprobs: list[float] | None = None


class GenerationBackend(Protocol):
    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float = 1.0,
        tries: list | None = None, seeds: list[int] | None = None,
    ) -> list[Generation]:
        """tries: optional per-prompt `ActionTrie` restricting the response to admissible actions.
        seeds: optional per-prompt sampling seed: a row's sample then depends on its seed alone, not on the other
        rows of the call (an evaluation's common random numbers); None samples from the global RNG."""
        ...


def _eos_ids(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return sorted(i for i in ids if i is not None)


def _cut_at_eos(row: list[int], eos_ids) -> tuple[list[int], bool]:
    """The tokens up to and including the first EOS, and whether there was one."""
    cut = next((j for j, t in enumerate(row) if t in eos_ids), None)
    return (row, False) if cut is None else (row[: cut + 1], True)


def sampling_config(temperature: float, top_p: float, *, max_new_tokens: int, eos_ids: list[int], pad_id: int):
    """The complete `GenerationConfig` the transformers backend samples with: temperature and
    top-p, nothing else. Every setting that would add a logits processor is spelled out neutral
    (transformers >= 5 fills unset fields from the checkpoint's `generation_config.json`, and
    Qwen2.5-Instruct's sets repetition_penalty 1.05-1.1 and top_k 20), so tokens come from exactly
    the distribution the trainer scores (`token_logprobs` at the rollout temperature)."""
    from transformers import GenerationConfig

    sample = temperature > 0
    # min_new_tokens stays unset: generate() writes min_length from it into this config, and every later call with the
    # same config then warned that both were set
    return GenerationConfig(
        do_sample=sample, temperature=temperature if sample else 1.0, top_p=top_p if sample else 1.0, top_k=0,
        min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, repetition_penalty=1.0,
        encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0, length_penalty=1.0,
        exponential_decay_length_penalty=None, bad_words_ids=None, sequence_bias=None, suppress_tokens=None,
        begin_suppress_tokens=None, forced_bos_token_id=None, forced_eos_token_id=None, min_length=0,
        num_beams=1, num_return_sequences=1, renormalize_logits=False, remove_invalid_values=False,
        max_new_tokens=max_new_tokens, eos_token_id=list(eos_ids), pad_token_id=pad_id, use_cache=True,
    )


@contextlib.contextmanager
def _plain_generation_defaults(model):
    """Within the block, the model (and a peft wrapper's inner model) carries an empty
    `generation_config`, so no checkpoint default fills a field `sampling_config` left unset."""
    from transformers import GenerationConfig

    holders = [m for m in (model, getattr(getattr(model, "base_model", None), "model", None)) if m is not None
               and hasattr(m, "generation_config")]
    saved = [(m, m.generation_config) for m in holders]
    try:
        for m, _ in saved:
            m.generation_config = GenerationConfig()
        yield
    finally:
        for m, cfg in saved:
            m.generation_config = cfg


class TransformersBackend:
    """Batched sampling on a KV cache; prompts are left-padded. Sampling (temperature > 0) goes through the one
    sampler (`sdar.agent.decoding.constrained_sample`), free rows too; greedy decoding (temperature 0, an argmax at
    each step) through `model.generate`, a trie through `TrieLogitsProcessor`.

    batch_size bounds memory: prompts are generated in chunks of this many.
    record_logprobs: greedy decoding also fills `Generation.logprobs` (the log-softmax of each step's processed
        logits), for checking that decoding equals scoring; costs a vocabulary-wide float row per token while a
        chunk generates: off by default. Sampling fills them always.
    inference: called at every `generate` for the module that samples (`Policy.inference_model`: the
        current weights with the LoRA adapter merged into plain layers); None = `model` itself.
    sampler, pack_tokens: the forward layout of the sampler (`constrained_sample`; rollout.sampler, resolved).
    """

    def __init__(self, model, tokenizer, batch_size: int = 64, record_logprobs: bool = False,
                 jump_forward: bool = True, inference=None, share_prefix: bool = False, sampler: str = "batched",
                 pack_tokens: int = 2048) -> None:
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.inference = inference
        self.record_logprobs = record_logprobs
        self.jump_forward = jump_forward
        self.share_prefix = share_prefix
        self.sampler, self.pack_tokens = sampler, pack_tokens
        self.decode_stats = DecodeStats()  # forwards, tokens and forced tokens of constrained sampling so far
        self.eos_ids = _eos_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens, temperature, top_p=1.0, tries=None, seeds=None):
        out: list[Generation] = []
        model = self.model if self.inference is None else self.inference()
        was_training = model.training
        model.eval()
        tries = tries or [None] * len(prompts)
        try:
            for start in range(0, len(prompts), self.batch_size):
                sl = slice(start, start + self.batch_size)
                out.extend(self._generate_chunk(model, prompts[sl], max_new_tokens, temperature, top_p, tries[sl],
                                                None if seeds is None else seeds[sl]))
        finally:
            model.train(was_training)
        return out

    def _generate_chunk(self, model, prompts, max_new_tokens, temperature, top_p, tries, seeds=None):
        if temperature > 0:
            # the one sampler, constrained and free rows alike: forced tokens cost no decision (with jump_forward no
            # decode step), and each row draws from its own generator (seeded: an evaluation's common random
            # numbers; else from the global RNG), every live row of a step in one batched pass
            rows = constrained_sample(model, prompts, tries, max_new_tokens=max_new_tokens,
                                      temperature=temperature, top_p=top_p, eos_ids=self.eos_ids, pad_id=self.pad_id,
                                      jump_forward=self.jump_forward, share_prefix=self.share_prefix,
                                      stats=self.decode_stats, seeds=seeds, sampler=self.sampler,
                                      pack_tokens=self.pack_tokens)
            return [Generation(r.token_ids, self.tokenizer.decode(r.token_ids, skip_special_tokens=True), r.finished,
                               r.logprobs) for r in rows]
        device = next(model.parameters()).device
        ids, mask = padded(prompts, self.pad_id, left=True)
        width = ids.shape[1]
        gen_cfg = sampling_config(temperature, top_p, max_new_tokens=max_new_tokens, eos_ids=self.eos_ids,
                                  pad_id=self.pad_id)
        kwargs = {}
        if any(t is not None for t in tries):
            from transformers import LogitsProcessorList

            from sdar.agent.constrained import TrieLogitsProcessor

            kwargs["logits_processor"] = LogitsProcessorList([TrieLogitsProcessor(list(tries), width)])
        if self.record_logprobs:
            gen_cfg.output_scores, gen_cfg.return_dict_in_generate = True, True
        with _plain_generation_defaults(model):
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                      generation_config=gen_cfg, **kwargs)
        seqs = out.sequences if self.record_logprobs else out
        new = seqs[:, width:]
        lps = None
        if self.record_logprobs:  # scores[t]: the processed logits step t sampled from
            steps = torch.stack([torch.log_softmax(sc.float(), dim=-1) for sc in out.scores], dim=1)
            lps = steps.gather(-1, new[:, : steps.shape[1]].unsqueeze(-1)).squeeze(-1).tolist()
        gens = []
        for i, row in enumerate(new.tolist()):
            toks, finished = _cut_at_eos(row, self.eos_ids)
            gens.append(Generation(toks, self.tokenizer.decode(toks, skip_special_tokens=True), finished,
                                   None if lps is None else lps[i][: len(toks)]))
        return gens


# ---- vLLM -------------------------------------------------------------------------------------
def vllm_problems(has_vllm: bool, has_cuda: bool) -> str | None:
    """Why the vLLM backend cannot run here (None when it can), as one sentence with the fix."""
    missing = ([] if has_vllm else ["the vllm package is not installed"]) + (
        [] if has_cuda else ["no CUDA device is visible (torch.cuda.is_available() is False)"])
    if not missing:
        return None
    return (f"the vLLM rollout engine needs vllm on a CUDA machine, but {' and '.join(missing)}: "
            f"{GPU_INSTALL_HINT}, or set model.generation_backend: transformers")


def require_vllm() -> None:
    """Raise `RuntimeError` saying what is missing (vllm, a CUDA device) and what to do about it."""
    import importlib.util

    why = vllm_problems(importlib.util.find_spec("vllm") is not None, torch.cuda.is_available())
    if why:
        raise RuntimeError(why)


@dataclass(frozen=True)
class AdapterVersion:
    """One exported adapter: vLLM's `LoRARequest(name, id, path)` for it."""

    name: str
    id: int
    path: str


class AdapterExporter:
    """Writes the live LoRA adapter (peft `save_pretrained`) to `<root>/policy-<id>` whenever its
    weights changed since the last export, under a fresh integer id: vLLM caches adapters by id, so
    a reused id would keep serving stale weights.

    Change detection reads each trainable tensor's in-place version counter and storage address:
    optimizer steps and checkpoint loads bump them, so checking costs no copy and no hash.
    keep: exported directories kept on disk (vLLM reads one when its id is first requested).
    """

    def __init__(self, root: str | Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = max(1, keep)
        self.current: AdapterVersion | None = None
        self._fingerprint: tuple | None = None
        self._next_id = 1
        self._dirs: list[Path] = []

    @staticmethod
    def fingerprint(model: torch.nn.Module) -> tuple:
        return tuple((n, p.data_ptr(), p._version) for n, p in model.named_parameters() if p.requires_grad)

    def sync(self, model: torch.nn.Module) -> AdapterVersion:
        """The adapter version matching `model` now (exported first if the weights changed)."""
        fp = self.fingerprint(model)
        if self.current is None or fp != self._fingerprint:
            self.export(model)
            self._fingerprint = fp
        return self.current

    def export(self, model: torch.nn.Module) -> AdapterVersion:
        """Export unconditionally under the next id."""
        from peft import PeftModel

        if not isinstance(model, PeftModel):
            raise TypeError("the vLLM backend serves the policy as a LoRA adapter; this model has none "
                            "(set model.lora: true, or use model.generation_backend: transformers)")
        vid = self._next_id
        self._next_id += 1
        path = self.root / f"policy-{vid}"
        # embeddings are never LoRA targets here; False also keeps peft from looking the base up on a hub
        model.save_pretrained(str(path), save_embedding_layers=False)
        self._dirs.append(path)
        while len(self._dirs) > self.keep:
            shutil.rmtree(self._dirs.pop(0), ignore_errors=True)
        self.current = AdapterVersion(f"policy-{vid}", vid, str(path))
        return self.current


def export_base_model(policy, directory: str | Path) -> str:
    """What vLLM should load as the base weights: the checkpoint name the policy's base came from
    (a local directory or a hub id), else (a freshly built tiny model) its initial weights and
    tokenizer written to `directory`."""
    from sdar.models.policy import resolve_name

    if policy.base_source is not None:
        kind, where = resolve_name(policy.base_source)
        if kind in ("local", "hub"):
            return where
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    policy._initial_weights().save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    return str(out)


def generation_from_vllm(token_ids, logprobs, eos_ids, tokenizer) -> Generation:
    """A `Generation` from one vLLM CompletionOutput's `token_ids` and `logprobs` (a list, per
    token, of {token id: Logprob}; or None), cut and decoded exactly as `TransformersBackend` does."""
    toks, finished = _cut_at_eos([int(t) for t in token_ids], eos_ids)
    lps = [float(logprobs[j][t].logprob) for j, t in enumerate(toks)] if logprobs else None
    return Generation(toks, tokenizer.decode(toks, skip_special_tokens=True), finished, lps)


def follows_trie(trie, token_ids: list[int]) -> bool:
    """Whether every token of a response was allowed by `trie` at its position."""
    return all(t in a for t, a in zip(token_ids, trie.allowed_along(token_ids)))


class VLLMBackend:
    """vLLM engine for GPU rollouts and (optionally) teacher scoring, with the same `generate` as
    `TransformersBackend`.

    The base weights are loaded once; the policy's LoRA adapter is exported and handed to vLLM as a
    `LoRARequest` with a fresh id whenever its weights changed (checked at every call), so each RL
    step samples from the current policy without reloading the model. Constrained decoding runs the
    `ActionTrie` as a per-request logits processor: on the V1 engine through the
    `sdar.agent.vllm_trie` plug-in (trie in `SamplingParams.extra_args`; the legacy V1 model runner
    interface, so VLLM_USE_V2_MODEL_RUNNER defaults to 0 here), on the V0 engine as a callable in
    `SamplingParams.logits_processors`.
    """

    def __init__(self, policy, *, gpu_memory_utilization: float = 0.35, enable_lora: bool = True,
                 max_lora_rank: int = 0, dtype: str = "bfloat16", max_model_len: int = 0,
                 enforce_eager: bool = False, logprobs_mode: str = "processed_logprobs", teacher_topk: int = 20,
                 workdir: str | None = None, engine_kwargs: dict[str, Any] | None = None) -> None:
        require_vllm()
        import os

        from vllm import LLM

        if policy.is_lora and not enable_lora:
            raise ValueError("vllm.enable_lora is false but the policy trains a LoRA adapter: vLLM would sample from "
                             "the base weights forever; set vllm.enable_lora: true")
        if not policy.is_lora:
            raise ValueError("the vLLM backend serves the policy as base weights + a LoRA adapter re-exported each "
                             "step; full fine-tuning (model.lora: false) would need a weight sync into vLLM that sdar "
                             "does not do: set model.lora: true or model.generation_backend: transformers")
        self.policy, self.tokenizer = policy, policy.tokenizer
        self.eos_ids = _eos_ids(self.tokenizer)
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="sdar-vllm-")
        root = Path(workdir or self._tmp.name)
        self.model_path = export_base_model(policy, root / "base")
        self.exporter = AdapterExporter(root / "adapters")
        self._lora = None
        self.logprobs_mode = logprobs_mode
        kwargs: dict[str, Any] = {
            "model": self.model_path, "dtype": dtype, "gpu_memory_utilization": gpu_memory_utilization,
            "enable_lora": True, "max_lora_rank": max_lora_rank or policy.spec.lora_r, "max_loras": 1,
            "max_logprobs": max(20, teacher_topk), "enforce_eager": enforce_eager,
        }
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if logprobs_mode:  # vLLM >= 0.10.2; "" keeps vLLM's default (raw, unconstrained log-probs)
            kwargs["logprobs_mode"] = logprobs_mode
        try:  # the V0 engine (vLLM < 0.11, VLLM_USE_V1=0) takes per-request callables; V1 needs the plug-in
            import vllm.envs as venvs

            self._v0 = not getattr(venvs, "VLLM_USE_V1", True)
        except ImportError:
            self._v0 = False
        self._trie_plugin = False
        if not self._v0:
            try:
                import vllm.v1.sample.logits_processor as lp

                self._trie_plugin = hasattr(lp, "AdapterLogitsProcessor")
            except ImportError:
                pass
            if self._trie_plugin:
                from sdar.agent.vllm_trie import PROCESSOR_FQCN

                # the plug-in implements the legacy V1 runner's interface (MRV2 has its own)
                os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
                kwargs["logits_processors"] = [PROCESSOR_FQCN]
        kwargs.update(engine_kwargs or {})
        try:
            self.llm = LLM(**kwargs)
        except TypeError as exc:
            if "logprobs_mode" in str(exc):
                raise TypeError(f"{exc}; this vLLM predates logprobs_mode (0.10.2): set vllm.logprobs_mode: '' "
                                "(sampled log-probs are then unconstrained; the trainer does not use them)") from exc
            raise

    # -- the policy's adapter --------------------------------------------------------------------
    def sync_policy(self, model=None) -> AdapterVersion:
        """Point vLLM at the adapter matching the policy's current weights (exported if they changed)."""
        from vllm.lora.request import LoRARequest

        version = self.exporter.sync(model if model is not None else self.policy.model)
        if self._lora is None or self._lora.lora_int_id != version.id:
            old = self._lora
            self._lora = LoRARequest(version.name, version.id, version.path)
            if old is not None:  # free the slot now; best effort, vLLM's LRU cache would evict it anyway
                with contextlib.suppress(Exception):
                    self.llm.llm_engine.remove_lora(old.lora_int_id)
        return version

    # -- generation -------------------------------------------------------------------------------
    def _constraint_kwargs(self, trie) -> dict[str, Any]:
        if trie is None:
            return {}
        if self._v0:
            from sdar.agent.constrained import TrieTokenFilter

            return {"logits_processors": [TrieTokenFilter(trie)]}
        if not self._trie_plugin:
            raise RuntimeError("this vLLM has no per-request logits-processor plug-ins (vllm.v1.sample.logits_processor."
                               "AdapterLogitsProcessor, vLLM >= 0.10.2): upgrade vllm, or set rollout.constrained: false "
                               "or model.generation_backend: transformers")
        from sdar.agent.vllm_trie import TRIE_ARG

        return {"extra_args": {TRIE_ARG: trie.sequences}}

    def generate(self, prompts, *, max_new_tokens, temperature, top_p=1.0, tries=None, seeds=None):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        self.sync_policy()
        tries = tries or [None] * len(prompts)
        # detokenize=False: text is decoded here exactly as the transformers backend does
        base = {"max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
                "stop_token_ids": self.eos_ids, "detokenize": False, "logprobs": 0 if self.logprobs_mode else None}
        if any(t is not None for t in tries) or seeds is not None:  # vLLM's per-request seed: common random numbers
            params = [SamplingParams(**base, **self._constraint_kwargs(t),
                                     **({} if seeds is None else {"seed": int(seeds[i]) % 2**63}))
                      for i, t in enumerate(tries)]
        else:
            params = SamplingParams(**base)
        results = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    lora_request=self._lora, use_tqdm=False)
        gens = [generation_from_vllm(r.outputs[0].token_ids, r.outputs[0].logprobs if self.logprobs_mode else None,
                                     self.eos_ids, self.tokenizer) for r in results]
        for g, trie in zip(gens, tries):
            if trie is not None and not follows_trie(trie, g.token_ids):
                # e.g. a model runner whose logits processors see placeholder ids: never train on such samples
                raise RuntimeError(f"vLLM sampled {g.token_ids} outside the admissible actions: the trie plug-in did "
                                   "not constrain it (run with VLLM_USE_V2_MODEL_RUNNER=0 and "
                                   "vllm.engine_kwargs: {async_scheduling: false}), or set rollout.constrained: false")
        return gens

    # -- teacher scoring ---------------------------------------------------------------------------
    def prompt_logprobs(self, sequences: list[list[int]], topk: list[int]) -> list:
        """vLLM's `RequestOutput.prompt_logprobs` of each sequence under the current adapter: per
        token, None for the first, else {token id: Logprob} holding that token and the `topk[i]`
        most likely ones. Raw log-probs (no temperature, no logits processors)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not sequences:
            return []
        self.sync_policy()
        params = [SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=int(k), detokenize=False)
                  for k in topk]
        results = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], params,
                                    lora_request=self._lora, use_tqdm=False)
        return [r.prompt_logprobs for r in results]


def make_backend(name: str, policy, *, vllm=None, batch_size: int = 64, jump_forward: bool = True,
                 share_prefix: bool = False, sampler: str = "batched", pack_tokens: int = 2048):
    """The generation backend `name` (model.generation_backend) for `policy`.

    vllm: a `sdar.config.VLLMConfig` (or anything with its fields) for the vLLM engine.
    jump_forward: the transformers backend's constrained decoding skips decode steps for forced tokens.
    share_prefix: the transformers backend's constrained prefill encodes shared prompt starts once per group.
    sampler, pack_tokens: the forward layout of the transformers backend's sampler (rollout.sampler, resolved).
    """
    if name == "transformers":  # samples with the policy's inference module (merged LoRA when policy.plain_inference)
        return TransformersBackend(policy.model, policy.tokenizer, batch_size=batch_size, jump_forward=jump_forward,
                                   inference=policy.inference_model, share_prefix=share_prefix, sampler=sampler,
                                   pack_tokens=pack_tokens)
    if name == "vllm":
        opts = {} if vllm is None else {k: getattr(vllm, k) for k in (
            "gpu_memory_utilization", "enable_lora", "max_lora_rank", "dtype", "max_model_len", "enforce_eager",
            "logprobs_mode", "teacher_topk", "engine_kwargs")}
        return VLLMBackend(policy, **opts)
    raise ValueError(f"unknown generation_backend {name!r}; choose one of {', '.join(BACKENDS)}")
