#!/usr/bin/env bash
# Download the wheels a lent GPU machine needs to run scripts/gpu_check.sh, on a machine with
# network, into a folder that then travels with the repository (see docs/development.md,
# "Checking on a GPU").
#
#   scripts/gpu_wheels.sh [DEST]      (default: .gpu-wheels, ignored by git)
#
# The GPU machines have Python 3.12 with torch (CUDA), numpy, onnx, onnxruntime, pytest,
# hypothesis, click, rich, psutil and nvidia-ml-py (seen on an H200 machine, 2026-11-26), and no
# network. Only what they lack travels: a wheel of something they have would be installed ahead
# of it and shadow their version (onnx 1.17 built for an older numpy over their onnx 1.23 and
# numpy 2.5, pytest 9.2 under their pytest plugins). The wheels are exact versions for CPython
# 3.12 on x86_64 Linux, downloaded with --no-deps: nothing is resolved (about 3.5 MiB in all).
# tests/test_gpu_kit.py fails when a runtime dependency of pyproject.toml is in neither list.
set -euo pipefail

DEST=${1:-.gpu-wheels}
PY=${PYTHON:-python3}

# What the GPU machine has already; never downloaded.
MACHINE_HAS=(torch numpy onnx onnxruntime psutil click rich nvidia-ml-py pytest hypothesis
    packaging typing-extensions cloudpickle)

WHEELS=(
    ale-py==0.12.1 # the emulator, with the Pong ROM
    gymnasium==1.4.0
    farama-notifications==0.0.6
    tomli-w==1.2.0
)

# pip does not widen a PEP 600 platform tag to older glibc versions: name each one.
PLATFORMS=(--platform manylinux2014_x86_64)
for glibc in 5 12 17 24 25 26 27 28; do
    PLATFORMS+=(--platform "manylinux_2_${glibc}_x86_64")
done

mkdir -p "$DEST"
# The machine installs every wheel in the folder: one left from an older list would travel too.
rm -f "$DEST"/*.whl
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 "${PLATFORMS[@]}" --dest "$DEST" "${WHEELS[@]}"
echo "$(find "$DEST" -name '*.whl' | wc -l) wheels in $DEST ($(du -sh "$DEST" | cut -f1))"
