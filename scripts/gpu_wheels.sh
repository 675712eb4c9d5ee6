#!/usr/bin/env bash
# Download the wheels a lent GPU machine needs to run scripts/gpu_check.sh, on a machine with
# network, into a folder that then travels with the repository (see docs/development.md,
# "Checking on a GPU").
#
#   scripts/gpu_wheels.sh [DEST]      (default: .gpu-wheels, ignored by git)
#
# The GPU machines have Python 3.12, torch (CUDA), numpy and onnxruntime, and no network. The
# wheels below are exact versions for CPython 3.12 on x86_64 Linux, downloaded with --no-deps:
# nothing is resolved, so nothing can pull in a torch or a numpy over the machine's own (about
# 22.5 MiB in all). tests/test_gpu_kit.py fails when a runtime dependency of pyproject.toml is
# missing here.
set -euo pipefail

DEST=${1:-.gpu-wheels}
PY=${PYTHON:-python3}

# What the GPU machine has already; never downloaded.
MACHINE_HAS=(torch numpy onnxruntime)

WHEELS=(
    ale-py==0.12.1 # the emulator, with the Pong ROM
    gymnasium==1.4.0
    cloudpickle==3.1.3
    farama-notifications==0.0.6
    typing-extensions==4.16.0 # gymnasium 1.4 wants >= 4.12, the machine's may be older
    onnx==1.17.0              # 1.23 needs numpy >= 2 and a newer protobuf than the machine's
    psutil==7.2.2
    click==8.5.1
    rich==15.0.0
    markdown-it-py==4.3.0
    mdurl==0.1.2
    pygments==2.21.0
    nvidia-ml-py==13.615.71
    tomli-w==1.2.0
    pytest==9.2.0
    iniconfig==2.3.1
    pluggy==1.7.0
    packaging==26.3
    hypothesis==6.170.17 # test modules with GPU tests import it
    sortedcontainers==2.4.0
)

# pip does not widen a PEP 600 platform tag to older glibc versions: name each one.
PLATFORMS=(--platform manylinux2014_x86_64)
for glibc in 5 12 17 24 25 26 27 28; do
    PLATFORMS+=(--platform "manylinux_2_${glibc}_x86_64")
done

mkdir -p "$DEST"
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 "${PLATFORMS[@]}" --dest "$DEST" "${WHEELS[@]}"
echo "$(find "$DEST" -name '*.whl' | wc -l) wheels in $DEST ($(du -sh "$DEST" | cut -f1))"
