#!/usr/bin/env bash
# The sampler's and the Scorer's layouts at the SmolLM2-135M shape on this machine (issue 45.1's CPU rule): the CPU's
# choice (on), packed scoring (batched) and the lookahead with packed scoring (packed), one process per layout, one
# after another. All three in one process (bench_train_step.py --modes on,batched,packed) builds six SmolLM2 trainers
# at once and held 24 GB on a 24 GB machine (killed for memory); one layout's two trainers fit. The layouts are not
# interleaved step by step, so run it on a quiet machine. Extra arguments go to each run (e.g. --smoke, --steps 2).
# PYTHON picks the interpreter (tools/bench_tables.py sets it to its own; default python3); each layout's figures go
# to $OUT/layouts_smollm2_<layout>.json (OUT defaults to runs/bench).
set -euo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-runs/bench}
for mode in on batched packed; do
  echo "layout $mode (one process):"
  echo
  "$PY" benchmarks/bench_train_step.py --model smollm2 --steps 1 --modes "$mode" --json "$OUT/layouts_smollm2_$mode.json" "$@"
  echo
done
