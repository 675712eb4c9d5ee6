#!/usr/bin/env bash
# Run every CUDA path of edgerl on a machine with an NVIDIA GPU and keep what it finds.
#
#   scripts/gpu_check.sh [RESULTS_DIR]      (default: ./gpu-results)
#
# Steps, each writing its own file so a step that hangs or fails loses nothing of the others:
#   machine.txt    the GPU, driver, torch/CUDA/cuDNN versions
#   doctor.json    `edgerl doctor --deep --json` (its stderr goes to machine.txt)
#   gpu_tests.log  the tests marked `gpu`
#   bench.json     `edgerl bench --json` (updates/s per variant, env steps/s, sync/async loops)
#   resume.log     short train -> stop -> resume runs for perf.amp=off|bf16 x perf.pipeline=sync|async
#   suite.log      the whole test suite, on the GPU (failures.log: each failure as it happens)
# Set PYTHON to the interpreter that has torch; set SKIP_SUITE=1 to leave out the last step.
set -u
OUT=${1:-${OUT:-gpu-results}}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 SDL_VIDEODRIVER=dummy
edgerl() { "$PY" -m edgerl.cli "$@"; }
runs=$(mktemp -d)

{
    nvidia-smi || true
    "$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
EOF
    nproc
} >"$OUT/machine.txt" 2>&1

# stderr apart: logs and library warnings must not break the JSON document.
timeout 300 "$PY" -m edgerl.cli doctor --deep --json >"$OUT/doctor.json" 2>>"$OUT/machine.txt"
echo "doctor exit $?" >>"$OUT/machine.txt"

timeout 300 "$PY" -m pytest -q -rA --tb=short -m gpu -p no:cacheprovider >"$OUT/gpu_tests.log" 2>&1
echo "gpu tests exit $?" >>"$OUT/machine.txt"

timeout 420 "$PY" -m edgerl.cli bench --json --seconds "${BENCH_SECONDS:-10}" \
    --envs 8,16,32,64 >"$OUT/bench.json" 2>"$OUT/bench.err"
echo "bench exit $?" >>"$OUT/machine.txt"

# Stop and resume: the first run ends at its --steps (checkpoint written), the second resumes
# it; the async runs are stopped by SIGTERM instead, as systemd stops the service.
for amp in off bf16; do
    for pipeline in sync async; do
        dir="$runs/$amp-$pipeline"
        sets=(--set "perf.amp=$amp" --set "perf.pipeline=$pipeline" --set agent.learning_starts=2000
            --set replay.capacity=50000 --set display.enabled=false --run-dir "$dir" --quiet)
        {
            echo "=== amp=$amp pipeline=$pipeline: first run"
            if [ "$pipeline" = async ]; then
                timeout -s TERM 40 "$PY" -m edgerl.cli train --steps 10000000 "${sets[@]}"
            else
                timeout 300 "$PY" -m edgerl.cli train --steps 12000 "${sets[@]}"
            fi
            echo "exit $?"
            echo "=== amp=$amp pipeline=$pipeline: resumed"
            timeout -s TERM 30 "$PY" -m edgerl.cli train --steps 10000000 "${sets[@]}"
            echo "exit $?"
            tail -n 3 "$dir/metrics.csv"
        } >>"$OUT/resume.log" 2>&1
    done
done

if [ -z "${SKIP_SUITE:-}" ]; then
    # Failures are written to failures.log as they happen: a run cut off keeps them.
    EDGERL_FAILURE_LOG="$OUT/failures.log" timeout 900 "$PY" -m pytest -v --tb=short -rfE \
        -p no:cacheprovider -n "${WORKERS:-4}" >"$OUT/suite.log" 2>&1
    echo "suite exit $?" >>"$OUT/machine.txt"
fi
rm -rf "$runs"
