#!/usr/bin/env bash
# Usage: benchmarks/diagnose_synthesize.sh  (env: DIAG_TASKS, DIAG_TRIALS, CAL_TASKS, CAL_SAMPLES, CAL_REGEN, DATA_DIR)
# Issue 4 "done when": base SmolLM2 on toolbox, diagnose then synthesize, on this CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
export RETRACE_STORAGE_DATA_DIR=${DATA_DIR:-/tmp/retrace-diagnose}
export RETRACE_SYNTHESIZE_CALIBRATION_TASKS=${CAL_TASKS:-8}
export RETRACE_SYNTHESIZE_CALIBRATION_SAMPLES=${CAL_SAMPLES:-4}
export RETRACE_SYNTHESIZE_MAX_REGENERATIONS=${CAL_REGEN:-3}
R=.venv/bin/retrace
mkdir -p "${DATA_DIR:-/tmp/retrace-diagnose}"; $R up > ${DATA_DIR:-/tmp/retrace-diagnose}/up.log 2>&1 &
for i in $(seq 1 120); do
  grep -q "all services healthy" ${DATA_DIR:-/tmp/retrace-diagnose}/up.log && break
  sleep 5
done
$R status
$R agent create bot --model smollm2 --env toolbox
start=$(date +%s)
$R diagnose bot --tasks ${DIAG_TASKS:-24} --trials ${DIAG_TRIALS:-4} --wait 1800
echo "diagnose wall: $(( $(date +%s) - start ))s"
$R capabilities bot --json docs/bench/diagnose_toolbox_capabilities.json --plot docs/bench/diagnose_toolbox_capabilities.png
start=$(date +%s)
$R synthesize bot --wait 5400
echo "synthesize wall: $(( $(date +%s) - start ))s"
$R capabilities bot
$R down
