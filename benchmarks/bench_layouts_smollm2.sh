#!/usr/bin/env bash
# The sampler's and the Scorer's layouts at the SmolLM2-135M shape on this machine (issue 45.1's CPU rule): the CPU's
# choice (on), packed scoring (batched), the lookahead with packed scoring (packed) and the CPU's choice in plain
# bfloat16 (plain: model.cpu_mixed_precision=false, peft's own path), one process per layout, one
# after another, on configs/household-smollm2.yaml (its warm start, bfloat16) at issue 46's measured size, 2 tasks x 2
# rollouts a step (CONFIG picks another config; --set after it overrides the size). All three in one process (bench_train_step.py --modes on,batched,packed) builds six SmolLM2 trainers
# at once and held 24 GB on a 24 GB machine (killed for memory); one layout's two trainers fit. The layouts are not
# interleaved step by step, so run it on a quiet machine. Extra arguments go to each run (e.g. --smoke, --steps 2).
# PYTHON picks the interpreter (tools/bench_tables.py sets it to its own; default python3); each layout's figures go
# to $OUT/layouts_smollm2_<layout>.json (OUT defaults to runs/bench). LAYOUTS picks some of the four (default: all, in
# this order; the CI smoke runs two).
set -euo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-runs/bench}
CONFIG=${CONFIG:-configs/household-smollm2.yaml}
LAYOUTS=${LAYOUTS:-on batched packed plain}
for layout in $LAYOUTS; do
  case $layout in
    on|batched|packed|plain) ;;
    *) echo "bench_layouts_smollm2.sh: unknown layout '$layout' in LAYOUTS; pick from: on batched packed plain" >&2; exit 2 ;;
  esac
done
for layout in $LAYOUTS; do
  mode=$layout; extra=()
  if [ "$layout" = plain ]; then  # the CPU's choice in peft's own bfloat16 path, sdar.models.precision switched off
    mode=on; extra=(--set model.cpu_mixed_precision=false)
  fi
  echo "layout $layout (one process):"
  echo
  "$PY" benchmarks/bench_train_step.py --model smollm2 --config "$CONFIG" --set tasks_per_step=2 --set group_size=2 --steps 1 --modes "$mode" "${extra[@]}" --json "$OUT/layouts_smollm2_$layout.json" "$@"
  echo
done
