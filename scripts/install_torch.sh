#!/usr/bin/env bash
# PyTorch into a venv, its build chosen before the download (the Makefile's first step).
#
#   scripts/install_torch.sh VENV_BIN TORCH [INDEX]
#
# INDEX given (TORCH_INDEX=URL): pip takes TORCH from that index, as asked. Otherwise (auto) pip
# first resolves TORCH as it is configured, without installing (--dry-run: metadata only). Where
# what it would install is PyPI's CUDA build (it pulls in NVIDIA's CUDA libraries, several GB)
# and no NVIDIA GPU is here (no driver in /proc/driver/nvidia, no nvidia-smi), PyTorch's CPU
# index is taken instead: the CPU build, a 190 MB wheel. Anything else installs as resolved (a
# GPU machine's CUDA build; a CPU wheel pip is configured to find, as on this project's CI).
# EDGERL_HW_ROOT stands in for / where the driver is looked for (tests, as DESIGN.md says).
set -euo pipefail

BIN=${1:?usage: scripts/install_torch.sh VENV_BIN TORCH [INDEX]}
TORCH=${2:?usage: scripts/install_torch.sh VENV_BIN TORCH [INDEX]}
INDEX=${3:-auto}
CPU_INDEX=https://download.pytorch.org/whl/cpu
HW_ROOT=${EDGERL_HW_ROOT:-/}

if [ "$INDEX" != auto ]; then
    echo "== installing PyTorch ($TORCH) from $INDEX"
    exec "$BIN/pip" install --index-url "$INDEX" "$TORCH"
fi

report=$(mktemp)
trap 'rm -f "$report"' EXIT
cuda_build=0
if "$BIN/pip" install --dry-run --quiet --report "$report" "$TORCH" >/dev/null 2>&1; then
    # NVIDIA's libraries among what it would install: the CUDA build
    "$BIN/python" - "$report" <<'PY' && cuda_build=1
import json, sys
report = json.load(open(sys.argv[1]))
names = [item["metadata"]["name"].lower() for item in report.get("install", [])]
sys.exit(0 if any(n.startswith("nvidia-") for n in names) else 1)
PY
fi
gpu=0
if [ -e "${HW_ROOT%/}/proc/driver/nvidia/version" ] || nvidia-smi -L >/dev/null 2>&1; then
    gpu=1
fi

if [ "$cuda_build" = 1 ] && [ "$gpu" = 0 ]; then
    echo "== no NVIDIA GPU here: PyTorch's CPU build ($TORCH) from $CPU_INDEX, a 190 MB" \
        "download (0.87 GB installed), not PyPI's CUDA build of several GB" \
        "(TORCH_INDEX=https://pypi.org/simple for that one)"
    exec "$BIN/pip" install --index-url "$CPU_INDEX" "$TORCH"
fi
if [ "$cuda_build" = 1 ]; then
    echo "== installing PyTorch ($TORCH): the CUDA build, several GB, for this machine's" \
        "NVIDIA GPU (TORCH_INDEX=$CPU_INDEX for the CPU build, 190 MB)"
else
    echo "== installing PyTorch ($TORCH) as pip finds it"
fi
exec "$BIN/pip" install "$TORCH"
