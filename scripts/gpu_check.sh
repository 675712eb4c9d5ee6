#!/usr/bin/env bash
# Check edgerl's CUDA paths on a GPU machine lent for minutes, a few short steps per call, and keep
# what each step finds in a results directory (docs/development.md, "Checking on a GPU").
#
#   scripts/gpu_check.sh STEP RESULTS_DIR
#
# Steps, in the order to run them; each ends within its limit (all under 8 minutes) and writes
# only into RESULTS_DIR/STEP/, packed into RESULTS_DIR/STEP.tgz when it ends, so a step cut off
# loses nothing of the others and the directory stays a few files:
#   install  the wheels of .gpu-wheels (scripts/gpu_wheels.sh) into .gpu-site; every other step
#            does this first when what it imports is missing
#   machine  machine.txt: the GPU, driver, torch/CUDA/cuDNN versions, CPUs, the packages used
#   tests    gpu_tests.log, gpu_tests.xml: the tests marked gpu; gpu_failures.log: each
#            failure's traceback as it happens (a step cut off keeps them)
#   doctor   doctor.json: `edgerl doctor --deep --json` (its log in doctor.err)
#   bench    bench.json: `edgerl bench --set agent.algo=dqn --json` (its log in bench.err)
#   limit    limit.json: the learner alone with the GPU's time counted, at batch/train_freq 32/4,
#            64/8, 128/16 and 256/32, and the DQN loop sync and async at 32 and 64 environments
#            beside the emulator and the actor alone (`edgerl bench --set agent.algo=dqn --json`;
#            140 s on an H100)
#   pqnlimit pqnlimit.json: PQN's learner alone (the pong-gpu preset) with its pass over a rollout
#            eager and as one CUDA graph launch (perf.cuda_graphs=off, on), one JSON line each
#   pqnbench pqnbench.json: `edgerl bench --preset pong-gpu --json`: PQN's loop in both
#            pipelines (taking turns, and learning beside the actor) against the learner alone,
#            the emulator alone at 64 and 128 environments
#   pong     pong.log and run/: `edgerl train --preset pong-gpu` (Pong with PQN, 18+ within
#            2 minutes on an H200), stopped by SIGTERM as systemd stops the service if it runs
#            longer (PONG_SECONDS, 330); PONG_SETS adds settings as DQN_SETS does; then its
#            policy exported to ONNX and played with torch on the GPU and ONNX Runtime
#            (export.json, play-torch.json, play-onnx.json)
#   resume   resume.log and runs/<amp>-<pipeline>: DQN trained, stopped, resumed, for
#            perf.amp=off|bf16 x perf.pipeline=sync|async (RESUME_RUNS picks some, e.g.
#            "bf16-async"; each about 65 s)
#   cores    cores.json: `edgerl bench` of both learners' loops with the CPUs cut by taskset to
#            CORES (default 6, an Orin Nano's count; "6 12" adds an AGX Orin's), one JSON line
#            each
#   ga       ga.json: the genetic algorithm's members' Nature CNNs (Frostbite's 18 actions) at 64,
#            256 and 1024 rows, one batched call against one member at a time; ga-bN.log and
#            run-bN/: `edgerl train --set agent.algo=ga` on Frostbite on the GPU for GA_SECONDS
#            (100) with GA_ENVS environments (256), population GA_POP (200), at each
#            env.batch_size of GA_BATCHES ("0 128": lockstep, then two pipelined halves)
#   dqn      dqn.log and run/: `edgerl train --preset pong-gpu-dqn` (DQN Pong, 18+ within 2
#            minutes on an H100), stopped by SIGTERM after DQN_SECONDS (200); DQN_SETS adds
#            settings (e.g. "agent.batch_size=32 agent.train_freq=4"), each passed as --set
#   seeds    seeds.log and PRESET/seed-K/: SEEDS_COUNT (3) seeds of SEEDS_PRESET (pong-gpu; or
#            pong-gpu-dqn) from SEEDS_FROM (0), one after another, each stopped by SIGTERM after
#            SEEDS_SECONDS (110: 18+ within 2 minutes is the goal), evaluated every
#            SEEDS_EVAL_EVERY (250000) steps; `edgerl results` sums up the runs' files where they
#            are brought back (k of n at 18 within 2 minutes, final scores, IQM)
# Groups, each one call: check (install machine tests doctor bench: about 2.5 minutes on an
# H200), then pong (about 5 minutes), then resume (about 4), dqn (about 4; the limit step
# before it in the same call: about 2.5 more);
# all runs every step in order.
# steps.txt gets one line per step: its name, exit status and seconds. Run directories keep their
# logs and CSV files; checkpoints and replay files are listed (runs.txt) and removed, unless
# KEEP_FILES=1. PYTHON names the interpreter with torch (default python3).
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WHEELS=${GPU_WHEELS:-$ROOT/.gpu-wheels}
SITE=${GPU_SITE:-$ROOT/.gpu-site}
STEPS=(install machine tests doctor bench limit pqnlimit pqnbench pong resume dqn cores ga seeds)
# Groups of steps, each one call on a lent machine (bash reserves the name GROUPS).
GROUP_NAMES=(check pong resume dqn)
declare -A STEP_GROUPS=([check]="install machine tests doctor bench" [pong]="pong" [resume]="resume" [dqn]="dqn")
# Seconds each step may take in all, set-up included. Measured on an H200 with 16 cores
# (2026-11-26): install 1, machine 6, tests 39, doctor 22, bench 69 (--seconds 3), pong 289 (the
# preset ends itself at 2,000,000 steps), export and play 16. On an H100 (2026-11-27): tests 51,
# pong 252 (PONG_SECONDS=230), resume 66 (one run), pqnbench more than 180 (building 128
# environments takes 15-20 s each time, the actor alone 78 s): give it its whole limit.
# A group's limits add up to less than the 10 minutes one command may run.
declare -A LIMIT=([install]=60 [machine]=30 [tests]=200 [doctor]=90 [bench]=200 [limit]=240
    [pqnlimit]=150 [pqnbench]=260 [pong]=470 [resume]=330 [dqn]=270 [cores]=470 [ga]=400
    [seeds]=470)
PONG_SECONDS=${PONG_SECONDS:-330}
DQN_SECONDS=${DQN_SECONDS:-200}
# What the steps import: a missing one is named before the step starts, not mid-collection.
NEEDED="torch numpy gymnasium ale_py onnx onnxruntime psutil click rich pynvml tomli_w pytest hypothesis"

usage() {
    sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'
}

say() { echo "gpu_check: $*" >&2; }

export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 SDL_VIDEODRIVER=dummy SDL_AUDIODRIVER=dummy

step_install() {
    if [ -e "$SITE/.installed" ]; then
        return 0
    fi
    if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
        say "no wheels in $WHEELS: run scripts/gpu_wheels.sh where there is network and bring the folder along"
        return 1
    fi
    # --target and --no-deps: nothing the machine has (its torch, numpy) is touched.
    mkdir -p "$SITE" &&
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
import importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
else:
    print("torch.cuda.is_available() is False")
for name in ("numpy", "gymnasium", "ale-py", "onnx", "onnxruntime", "pytest", "hypothesis",
             "click", "rich", "psutil", "nvidia-ml-py", "tomli-w"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
EOF
        echo "cpus $(nproc)"
    } >"$OUT/machine.txt" 2>&1
}

step_tests() {
    local modules
    modules=$(grep -l 'pytest.mark.gpu' "$ROOT"/tests/test_*.py)
    # SIGINT first: pytest then prints what it has; the failure log has each traceback already.
    (cd "$ROOT" && EDGERL_FAILURE_LOG="$OUT/gpu_failures.log" timeout -k 10 -s INT 180 \
        "$PY" -m pytest -m gpu -v --tb=short -rfEs -p no:cacheprovider -o faulthandler_timeout=120 \
        --junitxml="$OUT/gpu_tests.xml" $modules) >"$OUT/gpu_tests.log" 2>&1
}

step_doctor() {
    # stderr apart: logs and library warnings must not break the JSON document.
    timeout -k 5 80 "$PY" -m edgerl.cli doctor --deep --json >"$OUT/doctor.json" 2>"$OUT/doctor.err"
}

step_bench() {
    timeout -k 10 -s INT 180 "$PY" -m edgerl.cli bench --json --seconds "${BENCH_SECONDS:-5}" \
        --set agent.algo=dqn --envs 8,16,32,64 --actor-envs 32 --loop-envs 4,32 \
        >"$OUT/bench.json" 2>"$OUT/bench.err"
}

step_limit() {
    timeout -k 10 -s INT 220 "$PY" -m edgerl.cli bench --json --seconds "${BENCH_SECONDS:-4}" \
        --set agent.algo=dqn --envs 4,32,64 --actor-envs 32 --loop-envs 32,64 \
        --batch-shapes 64/8,128/16,256/32 >"$OUT/limit.json" 2>"$OUT/limit.err"
}

step_pqnbench() {
    timeout -k 60 -s INT 180 "$PY" -m edgerl.cli bench --preset pong-gpu --json \
        --seconds "${BENCH_SECONDS:-8}" --envs 64,128 --actor-envs 128 \
        >"$OUT/pqnbench.json" 2>"$OUT/pqnbench.err"
}

step_pqnlimit() {
    local graphs
    for graphs in off on; do
        timeout -k 10 -s INT 70 "$PY" - "$graphs" >>"$OUT/pqnlimit.json" 2>>"$OUT/pqnlimit.err" <<'EOF'
import json, sys
import torch
from edgerl.envs import probe
from edgerl.measure.bench import BenchOptions, _config
from edgerl.run.learner_alone import learner_limit
cfg = _config(BenchOptions(preset="pong-gpu", overrides=(f"perf.cuda_graphs={sys.argv[1]}",)))
found = learner_limit(cfg, probe(cfg.env), torch.device("cuda"), 8.0)
print(json.dumps({"perf.cuda_graphs": sys.argv[1], **found}))
EOF
    done
}

step_ga() {
    local status
    timeout -k 10 -s INT 120 "$PY" - >"$OUT/ga.json" 2>"$OUT/ga.err" <<'EOF'
import json
import torch
from edgerl.config import EnvConfig
from edgerl.envs import probe
from edgerl.learners.population import forward_rates
from edgerl.learners.nets import build_q_network
spec = probe(EnvConfig(id="ALE/Frostbite-v5"))
net = build_q_network(spec, (256, 256))
for rows in (64, 256, 1024):
    found = forward_rates(net, spec, rows, torch.device("cuda"), 3.0)
    print(json.dumps({"device": torch.cuda.get_device_name(0), **found}), flush=True)
EOF
    local batch failed=0
    # Lockstep (0), then ALE's async mode in two halves (as Uber pipelined emulation with the
    # members' forward passes): each run stopped by SIGTERM after GA_SECONDS.
    for batch in ${GA_BATCHES:-0 128}; do
        {
            echo "=== edgerl train --set agent.algo=ga on Frostbite, env.batch_size=$batch, stopped by SIGTERM after ${GA_SECONDS:-100} s"
            timeout -k 30 -s TERM "${GA_SECONDS:-100}" "$PY" -m edgerl.cli train \
                --env ALE/Frostbite-v5 --set agent.algo=ga --set perf.device=cuda \
                --set env.num_envs="${GA_ENVS:-256}" --set env.batch_size="$batch" \
                --set ga.population="${GA_POP:-200}" --set ga.truncation=10 \
                --set ga.elite_candidates=5 --set ga.elite_episodes=5 --set eval.every_steps=0 \
                --set display.enabled=false --run-dir "$OUT/run-b$batch" --steps 50000000
            status=$?
            echo "exit $status (124: stopped by the time limit)"
        } >"$OUT/ga-b$batch.log" 2>&1
        [ "$status" = 0 ] || [ "$status" = 124 ] || failed=1
    done
    return $failed
}

# "--set a=1 --set b=2" from "a=1 b=2" (split on spaces only: agent.hidden=[256] stays as it is).
as_sets() {
    local setting settings
    read -r -a settings <<<"$1"
    for setting in "${settings[@]}"; do
        printf '%s\n' --set "$setting"
    done
}

step_pong() {
    local run="$OUT/run" status failed=0 extra=()
    mapfile -t extra < <(as_sets "${PONG_SETS:-}")
    {
        echo "=== edgerl train --preset pong-gpu ${PONG_SETS:-}, stopped by SIGTERM after $PONG_SECONDS s at most"
        timeout -k 30 -s TERM "$PONG_SECONDS" "$PY" -m edgerl.cli train --preset pong-gpu \
            --set display.enabled=false --set replay.persist=false --run-dir "$run" "${extra[@]}"
        status=$?
        echo "exit $status (124: stopped by the time limit)"
        cat "$run/eval.csv"
    } >"$OUT/pong.log" 2>&1
    [ "$status" = 0 ] || [ "$status" = 124 ] || failed=1
    # The learned policy: ONNX against PyTorch, then play's latency with each backend.
    timeout -k 5 30 "$PY" -m edgerl.cli export --onnx --json --run-dir "$run" \
        -o "$OUT/policy.onnx" >"$OUT/export.json" 2>>"$OUT/pong.log" || failed=1
    timeout -k 5 30 "$PY" -m edgerl.cli play --run-dir "$run" --device cuda --json \
        >"$OUT/play-torch.json" 2>>"$OUT/pong.log" || failed=1
    timeout -k 5 30 "$PY" -m edgerl.cli play --model "$OUT/policy.onnx" --json \
        >"$OUT/play-onnx.json" 2>>"$OUT/pong.log" || failed=1
    rm -f "$OUT/policy.onnx"
    return $failed
}

step_resume() {
    local amp pipeline dir status=0
    # Each run is stopped by SIGTERM, as systemd stops the service: the first one writes its
    # checkpoint (and replay) on the way out, the second resumes from them.
    for amp in off bf16; do
        for pipeline in sync async; do
            case " ${RESUME_RUNS:-off-sync off-async bf16-sync bf16-async} " in
                *" $amp-$pipeline "*) ;;
                *) continue ;;
            esac
            dir="$OUT/runs/$amp-$pipeline"
            local sets=(--set "perf.amp=$amp" --set "perf.pipeline=$pipeline"
                --set agent.learning_starts=2000 --set replay.capacity=50000
                --set display.enabled=false --run-dir "$dir" --quiet)
            # Stopped by SIGTERM (124) is how each run is meant to end; anything else failed.
            local first resumed
            {
                echo "=== amp=$amp pipeline=$pipeline: first run"
                timeout -k 10 -s TERM 35 "$PY" -m edgerl.cli train --steps 10000000 "${sets[@]}"
                first=$?
                echo "exit $first"
                echo "=== amp=$amp pipeline=$pipeline: resumed"
                timeout -k 10 -s TERM 25 "$PY" -m edgerl.cli train --steps 10000000 "${sets[@]}"
                resumed=$?
                echo "exit $resumed"
                ls "$dir" && tail -n 3 "$dir/metrics.csv"
            } >>"$OUT/resume.log" 2>&1
            for code in "$first" "$resumed"; do
                [ "$code" = 0 ] || [ "$code" = 124 ] || status=1
            done
        done
    done
    return $status
}

step_dqn() {
    local run="$OUT/run" status extra=()
    mapfile -t extra < <(as_sets "${DQN_SETS:-}")
    {
        echo "=== edgerl train --preset pong-gpu-dqn ${DQN_SETS:-}, stopped by SIGTERM after $DQN_SECONDS s at most"
        timeout -k 30 -s TERM "$DQN_SECONDS" "$PY" -m edgerl.cli train --preset pong-gpu-dqn \
            --steps 3000000 --set display.enabled=false --set replay.persist=false \
            --run-dir "$run" "${extra[@]}"
        status=$?
        echo "exit $status (124: stopped by the time limit)"
        cat "$run/eval.csv"
    } >"$OUT/dqn.log" 2>&1
    [ "$status" = 0 ] || [ "$status" = 124 ]
}

step_seeds() {
    local preset=${SEEDS_PRESET:-pong-gpu} first=${SEEDS_FROM:-0} count=${SEEDS_COUNT:-3}
    local seconds=${SEEDS_SECONDS:-110} seed status=0 code steps=()
    # As each preset's run on record was trained: DQN's with --steps 3M (PQN's anneals its
    # learning rate over the preset's own 2M steps: not changed).
    [ "$preset" = pong-gpu-dqn ] && steps=(--steps 3000000)
    # Each seed's build and start-up take 15-25 s beside its training: the count and the seconds
    # must fit the step's limit, or the last seed is cut off unfinished.
    if [ $((count * (seconds + 30))) -gt "${LIMIT[seeds]}" ]; then
        say "SEEDS_COUNT=$count runs of SEEDS_SECONDS=$seconds do not fit the step's ${LIMIT[seeds]} s: fewer seeds a call"
        return 2
    fi
    for ((seed = first; seed < first + count; seed++)); do
        {
            echo "=== edgerl train --preset $preset --seed $seed, stopped by SIGTERM after $seconds s"
            timeout -k 20 -s TERM "$seconds" "$PY" -m edgerl.cli train --preset "$preset" \
                --seed "$seed" --run-dir "$OUT/$preset/seed-$seed" "${steps[@]}" \
                --set "eval.every_steps=${SEEDS_EVAL_EVERY:-250000}" \
                --set display.enabled=false --set replay.persist=false --quiet
            code=$?
            echo "exit $code (124: stopped by the time limit)"
            cat "$OUT/$preset/seed-$seed/eval.csv"
        } >>"$OUT/seeds.log" 2>&1
        [ "$code" = 0 ] || [ "$code" = 124 ] || status=1
    done
    return $status
}

step_cores() {
    local cores preset status=0
    # CORES="6 12" (default 6: the Orin Nano's count); each bench ends within 4 minutes, two fit
    for cores in ${CORES:-6}; do
        for preset in pong-gpu pong-gpu-dqn; do
            echo "=== $preset on CPUs 0-$((cores - 1))" >>"$OUT/cores.err"
            # --loop-envs: DQN's preset count; PQN runs its own. One JSON document per line.
            timeout -k 60 -s INT 170 taskset -c "0-$((cores - 1))" "$PY" -m edgerl.cli bench \
                --preset "$preset" --json --seconds "${BENCH_SECONDS:-6}" --envs 32 \
                --actor-envs 32 --loop-envs 32 2>>"$OUT/cores.err" |
                "$PY" -c 'import json, sys; t = sys.stdin.read(); print(json.dumps(json.loads(t)) if t.strip() else "{}")' \
                    >>"$OUT/cores.json" || status=1
        done
    done
    return $status
}

# Checkpoints and replay files are too large to bring back: list them, then remove them.
prune_runs() {
    local dir=$1
    local listing
    listing=$(find "$dir" -type f \( -name '*.ckpt' -o -name '*.rpl' \) -exec ls -l {} + 2>&1)
    [ -n "$listing" ] || return 0
    echo "$listing" >>"$dir/runs.txt"
    if [ -z "${KEEP_FILES:-}" ]; then
        find "$dir" -type f \( -name '*.ckpt' -o -name '*.rpl' \) -delete
    fi
}

# One step, within its limit, timed, with its exit status in steps.txt and its files in STEP.tgz.
run_step() {
    local name=$1 started status
    started=$(date +%s)
    if [ "$name" != install ] && ! check_imports 2>/dev/null; then
        timeout -k 10 "${LIMIT[install]}" "$0" --inner install "$RESULTS" || true
    fi
    mkdir -p "$RESULTS/$name"
    if [ "$name" = install ] || [ "$name" = machine ] ||
        check_imports 2>>"$RESULTS/$name/imports.err"; then
        timeout -k 15 "${LIMIT[$name]}" "$0" --inner "$name" "$RESULTS/$name"
        status=$?
    else
        status=3
    fi
    [ -s "$RESULTS/$name/imports.err" ] || rm -f "$RESULTS/$name/imports.err"
    prune_runs "$RESULTS/$name"
    if [ -n "$(ls -A "$RESULTS/$name")" ]; then
        tar czf "$RESULTS/$name.tgz" -C "$RESULTS" "$name" && rm -rf "${RESULTS:?}/$name"
    else
        rmdir "$RESULTS/$name"
    fi
    echo "$name $status $(($(date +%s) - started))" >>"$RESULTS/steps.txt"
    say "$name: exit $status after $(($(date +%s) - started)) s (results in $RESULTS)"
    return "$status"
}

if [ "${1:-}" = --inner ]; then
    OUT=$3
    "step_$2"
    exit $?
fi

if [ $# -ne 2 ]; then
    usage >&2
    say "a step and a results directory are needed, as in: scripts/gpu_check.sh check results"
    exit 2
fi
STEP=$1
if [ "$STEP" = all ]; then
    CHOSEN=("${STEPS[@]}")
elif [ -n "${STEP_GROUPS[$STEP]+set}" ]; then
    read -r -a CHOSEN <<<"${STEP_GROUPS[$STEP]}"
elif [ -n "${LIMIT[$STEP]+set}" ]; then
    CHOSEN=("$STEP")
else
    say "unknown step $STEP; the steps are: ${STEPS[*]}; the groups: ${GROUP_NAMES[*]} all"
    exit 2
fi
mkdir -p "$2" || exit 2
RESULTS=$(cd "$2" && pwd)

failed=0
for name in "${CHOSEN[@]}"; do
    run_step "$name" || failed=$?
done
exit $failed
