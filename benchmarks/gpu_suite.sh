#!/usr/bin/env bash
# The GPU checks of one session on one CUDA machine, in one go (issues 14 and 17):
#   1. bench_train_step.py on household-tiny, float32, every speed-up on and off (the README's CPU command);
#   2. the evidence study's household seed-0 cells on the GPU (configs/study/evidence-cuda.yaml), one process
#      per arm on the one GPU once the shared warm start is built, stopped at the deadline (what finished
#      comes back: per-run JSON, partial ones too; `sdar study run` resumes the rest anywhere);
#   3. bench_train_step.py in bfloat16 (speed-ups on), with the time left before the deadline (BF16_S, 90 s).
# Run from the repository root with a python that has torch (CUDA), transformers, peft, numpy, pyyaml, rich:
#   bash benchmarks/gpu_suite.sh OUTDIR [DEADLINE_S]
# Figures and logs land in OUTDIR; the study's results in OUTDIR/study-results.tar.gz (untar at the repo root).
# SDAR_TRACKING=0 (MLflow need not be installed there); DRY=1 shrinks every size for a CPU rehearsal.
# SPEC=<study spec> runs another study's cells (the first seed with pending cells; default
# configs/study/evidence-cuda.yaml); BENCH=0 skips both benchmarks (the study gets the whole deadline).
set -uo pipefail
OUT=${1:?usage: gpu_suite.sh OUTDIR [DEADLINE_S]}
DEADLINE=${2:-540}
START=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
cap() { local l=$(( $(left) - 60 )); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }  # at most $1 s, leaving a minute
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export COLUMNS=${COLUMNS:-160} PYTHONPATH="$PWD/src:$PWD/envs/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SDAR_TRACKING=0
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-file:///tmp/sdar-mlruns}  # never opened (tracking off)
export SDAR_CACHE_DIR=${SDAR_CACHE_DIR:-/tmp/sdar-cache}
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  nproc; $PY -c "import sys, torch, transformers, peft, numpy; print(sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'peft', peft.__version__, 'numpy', numpy.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

WS=(--set warmstart.episodes=300 --set warmstart.epochs=2)
STEPS=3
if [ "${DRY:-0}" = 1 ]; then WS=(--set warmstart.episodes=20 --set warmstart.epochs=1 --set warmstart.tokenizer_episodes=20); STEPS=1; fi

BENCH=${BENCH:-1}
echo "== bench fp32, on/off ($(left) s left)"
[ "$BENCH" = 1 ] && timeout $(cap 200) $PY benchmarks/bench_train_step.py --steps $STEPS --compare-off "${WS[@]}" \
  --json "$OUT/bench_fp32.json" > "$OUT/bench_fp32.log" 2>&1; echo "rc $?"
tail -n 25 "$OUT/bench_fp32.log"
echo "== study ($(left) s left)"
SPEC=${SPEC:-configs/study/evidence-cuda.yaml}
RES=/tmp/sdar-study-results
if [ "${DRY:-0}" = 1 ]; then  # the same cells, tiny and on the CPU
  cat > /tmp/sdar-dry-spec.yaml <<'YAML'
study: evidence-cuda
steps: 2
eval_steps: [1, 2]
configs: {household: configs/household-tiny.yaml}
set: {device: cpu, eval_tasks: 4, warmstart.episodes: 20, warmstart.epochs: 1, warmstart.tokenizer_episodes: 20}
matrices: [{families: [household], arms: [grpo, grpo_opsd, sdar], seeds: [0]}]
YAML
  SPEC=/tmp/sdar-dry-spec.yaml
fi
NAME=$(sed -n 's/^study: *//p' "$SPEC")
SEED=$($PY -c "
import sys, yaml; sys.path.insert(0, 'src')
from sdar.study import parse_spec
from sdar.study.runner import StudyRunner
spec = parse_spec(yaml.safe_load(open('$SPEC')), '$SPEC')
pending = [r['cell'] for r in StudyRunner(spec, 'docs/results', '/tmp/sdar-probe').status() if r['state'] != 'done']
print(pending[0].split('/')[1][4:] if pending else '')" 2>/dev/null)
[ -n "$SEED" ] || { echo "no pending cell in $SPEC"; SEED=0; }
mkdir -p $RES
[ "${DRY:-0}" = 1 ] || [ ! -d "docs/results/$NAME" ] || cp -r "docs/results/$NAME" $RES/  # finished cells stay finished
[ "$BENCH" = 1 ] || BF16_S=25
study() { timeout $(( $(left) - ${BF16_S:-90} )) $PY -c "from sdar.cli import main; main()" study run --spec $SPEC --results $RES "$@"; }
WARM=$RES/$NAME/household/seed$SEED/warmstart.json
study --only seed=$SEED,arm=grpo > "$OUT/study_grpo.log" 2>&1 &
while [ ! -f $WARM ] && kill -0 %1 2>/dev/null && [ "$(left)" -gt 40 ]; do sleep 2; done
if [ -f $WARM ]; then
  study --only seed=$SEED,arm=grpo_opsd > "$OUT/study_grpo_opsd.log" 2>&1 &
  study --only seed=$SEED,arm=sdar > "$OUT/study_sdar.log" 2>&1 &
fi
wait
echo "study done or stopped ($(left) s left)"
tar -czf "$OUT/study-results.tar.gz" -C $RES . 2>/dev/null
# the runs' step histories and the partial records of runs the deadline stopped (in the study's work directory)
(cd "$SDAR_CACHE_DIR" && tar -czf "$OUT/study-work.tar.gz" study/*/*/*/*/history.json study/*/*/*/*.partial.json) 2>/dev/null
tail -n 3 "$OUT"/study_*.log
echo "== bench bf16, on ($(left) s left)"
[ "$BENCH" = 1 ] && [ "$(left)" -gt 50 ] && timeout $(( $(left) - 15 )) $PY benchmarks/bench_train_step.py --steps $STEPS "${WS[@]}" --set model.dtype=bfloat16 \
  --json "$OUT/bench_bf16.json" > "$OUT/bench_bf16.log" 2>&1; echo "rc $?"
tail -n 12 "$OUT/bench_bf16.log"

ls -la "$OUT"
