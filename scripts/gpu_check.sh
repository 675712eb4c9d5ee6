#!/usr/bin/env bash
# Check edgerl's CUDA paths on a GPU machine lent for minutes, one short step per call, and keep
# what each step finds in a results directory (docs/development.md, "Checking on a GPU").
#
#   scripts/gpu_check.sh STEP RESULTS_DIR
#
# Steps, in the order to run them; each ends within its limit (all under 8 minutes) and writes
# only into RESULTS_DIR, so a step cut off loses nothing of the others:
#   install  the wheels of .gpu-wheels (scripts/gpu_wheels.sh) into .gpu-site; every other step
#            does this first when what it imports is missing
#   machine  machine.txt: the GPU, driver, torch/CUDA/cuDNN versions, CPUs, the wheels installed
#   doctor   doctor.json: `edgerl doctor --deep --json` (its log in doctor.err)
#   tests    gpu_tests.log, gpu_tests.xml: the tests marked gpu; gpu_failures.log: each
#            failure's traceback as it happens (a step cut off keeps them)
#   bench    bench.json: `edgerl bench --json` (its log in bench.err)
#   pong     pong.log and runs/pong: Pong against the clock (docs/performance.md), stopped by
#            SIGTERM as systemd stops the service
#   resume   resume.log and runs/<amp>-<pipeline>: train, stop, resume, for perf.amp=off|bf16 x
#            perf.pipeline=sync|async
#   all      every step in order (about 35 minutes: only for a machine held that long)
# steps.txt gets one line per step: its name, exit status and seconds. Run directories are kept
# with their logs and CSV files; checkpoints and replay files are listed (runs.txt) and removed,
# unless KEEP_FILES=1. PYTHON names the interpreter with torch (default python3).
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WHEELS=${GPU_WHEELS:-$ROOT/.gpu-wheels}
SITE=${GPU_SITE:-$ROOT/.gpu-site}
STEPS=(install machine doctor tests bench pong resume)
# Seconds each step may take in all, set-up included: a command on a lent machine may run 10
# minutes, and the machine is lent for about 30.
declare -A LIMIT=([install]=120 [machine]=60 [doctor]=300 [tests]=450 [bench]=450 [pong]=450
    [resume]=450)
PONG_SECONDS=${PONG_SECONDS:-360}
# What the steps import: a missing one is named before the step starts, not mid-collection.
NEEDED="torch numpy gymnasium ale_py onnx onnxruntime psutil click rich pynvml tomli_w pytest hypothesis"

usage() {
    sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'
}

say() { echo "gpu_check: $*" >&2; }

export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 SDL_VIDEODRIVER=dummy SDL_AUDIODRIVER=dummy

edgerl() { "$PY" -m edgerl.cli "$@"; }

step_install() {
    if [ -e "$SITE/.installed" ]; then
        return 0
    fi
    if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
        say "no wheels in $WHEELS: run scripts/gpu_wheels.sh where there is network and bring the folder along"
        return 1
    fi
    # --target and --no-deps: nothing the machine has (its torch, numpy) is touched.
    "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl &&
        touch "$SITE/.installed"
}

# Names the modules the steps import that this Python cannot; returns 1 if there are any.
check_imports() {
    "$PY" - $NEEDED <<'EOF'
import importlib.util, sys
missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
if missing:
    print("gpu_check: cannot import " + ", ".join(missing) + ": run scripts/gpu_wheels.sh "
          "where there is network and bring .gpu-wheels along", file=sys.stderr)
    sys.exit(1)
EOF
}

step_machine() {
    {
        nvidia-smi || echo "nvidia-smi: not found or failed"
        "$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
else:
    print("torch.cuda.is_available() is False")
EOF
        echo "cpus $(nproc)"
        ls "$SITE" 2>/dev/null | grep -i 'dist-info$' || true
    } >"$OUT/machine.txt" 2>&1
}

step_doctor() {
    # stderr apart: logs and library warnings must not break the JSON document.
    timeout -k 10 280 "$PY" -m edgerl.cli doctor --deep --json >"$OUT/doctor.json" 2>"$OUT/doctor.err"
}

step_tests() {
    local modules
    modules=$(grep -l 'pytest.mark.gpu' "$ROOT"/tests/test_*.py)
    # SIGINT first: pytest then prints what it has; the failure log has each traceback already.
    (cd "$ROOT" && EDGERL_FAILURE_LOG="$OUT/gpu_failures.log" timeout -k 20 -s INT 420 \
        "$PY" -m pytest -m gpu -v --tb=short -rfEs -p no:cacheprovider -o faulthandler_timeout=120 \
        --junitxml="$OUT/gpu_tests.xml" $modules) >"$OUT/gpu_tests.log" 2>&1
}

step_bench() {
    timeout -k 10 -s INT 430 "$PY" -m edgerl.cli bench --json --seconds "${BENCH_SECONDS:-10}" \
        --envs 8,16,32,64 >"$OUT/bench.json" 2>"$OUT/bench.err"
}

step_pong() {
    local dir="$OUT/runs/pong"
    cat >"$OUT/pong.toml" <<'EOF'
[env]
id = "ALE/Pong-v5"
num_envs = 8
repeat_action_probability = 0.0
[agent]
train_freq = 1
batch_size = 32
lr = 1e-4
target_update = 1000
learning_starts = 10_000
eps_decay_steps = 100_000
eps_end = 0.01
[replay]
capacity = 100_000
persist = false
[display]
enabled = false
[perf]
pipeline = "async"
EOF
    {
        echo "=== Pong, async, stopped by SIGTERM after $PONG_SECONDS s"
        timeout -k 60 -s TERM "$PONG_SECONDS" "$PY" -m edgerl.cli train --config "$OUT/pong.toml" \
            --steps 100000000 --run-dir "$dir" --quiet
        echo "exit $? (124: stopped by the time limit, as meant)"
        tail -n 5 "$dir/metrics.csv"
    } >"$OUT/pong.log" 2>&1
}

step_resume() {
    local amp pipeline dir status=0
    # Each run is stopped by SIGTERM, as systemd stops the service: the first one writes its
    # checkpoint (and replay) on the way out, the second resumes from them.
    for amp in off bf16; do
        for pipeline in sync async; do
            dir="$OUT/runs/$amp-$pipeline"
            local sets=(--set "perf.amp=$amp" --set "perf.pipeline=$pipeline"
                --set agent.learning_starts=2000 --set replay.capacity=50000
                --set display.enabled=false --run-dir "$dir" --quiet)
            {
                echo "=== amp=$amp pipeline=$pipeline: first run"
                timeout -k 20 -s TERM 45 "$PY" -m edgerl.cli train --steps 10000000 "${sets[@]}"
                echo "exit $?"
                echo "=== amp=$amp pipeline=$pipeline: resumed"
                timeout -k 20 -s TERM 30 "$PY" -m edgerl.cli train --steps 10000000 "${sets[@]}"
                echo "exit $?"
                ls "$dir" && tail -n 3 "$dir/metrics.csv"
            } >>"$OUT/resume.log" 2>&1 || status=1
        done
    done
    return $status
}

# Checkpoints and replay files are too large to bring back: list them, then remove them.
prune_runs() {
    [ -d "$OUT/runs" ] || return 0
    find "$OUT/runs" -type f -exec ls -l {} + >>"$OUT/runs.txt" 2>&1
    if [ -z "${KEEP_FILES:-}" ]; then
        find "$OUT/runs" -type f \( -name '*.ckpt' -o -name '*.rpl' \) -delete
    fi
}

# One step, within its limit, timed, with its exit status in steps.txt.
run_step() {
    local name=$1 started status
    started=$(date +%s)
    if [ "$name" != install ] && ! check_imports 2>/dev/null; then
        timeout -k 10 "${LIMIT[install]}" "$0" --inner install "$OUT" || true
    fi
    if [ "$name" = install ] || [ "$name" = machine ] || check_imports 2>>"$OUT/$name.err"; then
        timeout -k 15 "${LIMIT[$name]}" "$0" --inner "$name" "$OUT"
        status=$?
    else
        status=3
    fi
    prune_runs
    echo "$name $status $(($(date +%s) - started))" >>"$OUT/steps.txt"
    say "$name: exit $status after $(($(date +%s) - started)) s (results in $OUT)"
    return "$status"
}

if [ "${1:-}" = --inner ]; then
    OUT=$3
    "step_$2"
    exit $?
fi

if [ $# -ne 2 ]; then
    usage >&2
    say "a step and a results directory are needed, as in: scripts/gpu_check.sh doctor results"
    exit 2
fi
STEP=$1
OUT=$2
if [ "$STEP" != all ] && [ -z "${LIMIT[$STEP]+set}" ]; then
    say "unknown step $STEP; the steps are: ${STEPS[*]} all"
    exit 2
fi
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)

if [ "$STEP" = all ]; then
    failed=0
    for name in "${STEPS[@]}"; do
        run_step "$name" || failed=1
    done
    exit $failed
fi
run_step "$STEP"
