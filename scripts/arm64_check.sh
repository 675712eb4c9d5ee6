#!/usr/bin/env bash
# edgerl on a Jetson's CPU architecture, without a Jetson: a Debian arm64 userland run under
# qemu-user-static (binfmt_misc), with an AGX Orin's files (tests/fixtures/boards) as the board.
#
#   sudo scripts/arm64_check.sh [--jetpack 6.0|6.1] [--root DIR] [--board NAME] [--out DIR]
#
# What it does, each step timed into $OUT/steps.tsv and logged in $OUT/<step>.log:
#  1. a Debian bookworm arm64 root (debootstrap) in DIR, kept for the next run (one per JetPack;
#     default /var/lib/edgerl-arm64/jp<JetPack>, under a root-only directory);
#  2. JetPack's torch stood in for by PyPI's aarch64 CPU build of the same release, installed
#     system-wide as JetPack's is, and relabelled with that JetPack's version string (6.1, the
#     default: 2.5.0a0+872d972e41.nv24.08; 6.0: 2.3.0a0+40ec155e58.nv24.03, with the board's
#     L4T release made 36.3), so that the install takes the Jetson path it takes on a board;
#  3. scripts/install.sh (EDGERL_HW_ROOT: the board's files; EDGERL_TORCH_WITHOUT_CUDA=1, as
#     no CUDA runs under emulation), then the onnx extra;
#  4. edgerl doctor, a short CartPole run, a few hundred Pong steps, export --onnx and play.
# It is slow (every instruction emulated): 18 minutes on two cores, 4 more for a new root and
# torch; `make test` does not run it (tests/test_arm64.py does, with EDGERL_ARM64=1). Needs root,
# debootstrap, qemu-user-static and the network to Debian's mirror and PyPI. Python is
# bookworm's 3.11: JetPack 6 has 3.10 and JetPack 7 3.12, which no Debian release of arm64 offers.
#
# It runs as root, so it trusts no path another user could have made or can change: the arm64
# root must be root's and written by no one else, the log folder root's or the sudo user's, and
# every folder above either root's (or that user's) and written by no one else unless sticky (as
# /tmp, where nobody can rename what another owns); a link in their place or on the way to them
# (a trailing slash, a folder above, a .. after one) is refused, not followed. Its mounts live
# in a mount namespace of its own and end with it, killed included.
set -euo pipefail

ARGS=("$@")  # for the run again in a mount namespace of its own (below)
ROOTFS=""  # default: $KEEP/jp<JetPack>, one root per JetPack's torch
KEEP=/var/lib/edgerl-arm64  # made 0700: no other user reaches the roots kept in it
BOARD=agx_orin_jp6
OUT=${OUT:-$(pwd -P)/arm64-check}  # the real folder: no link on the way
SRC=$(cd "$(dirname "$0")/.." && pwd)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
JETPACK=6.1
NUMPY=1.26.4  # NVIDIA's guide pins NumPy 1.x beside its torch (Ubuntu's 1.21.5 has no 3.11 build)

die() { echo "arm64_check: error: $*" >&2; exit 1; }
refuse() { echo "arm64_check: error: $*" >&2; exit 2; }
value() { [ -n "${2-}" ] || refuse "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --root) value "$@"; ROOTFS=$2; shift 2 ;;
        --board) value "$@"; BOARD=$2; shift 2 ;;
        --jetpack) value "$@"; JETPACK=$2; shift 2 ;;
        --out) value "$@"; OUT=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) refuse "unknown option $1 (see --help)" ;;
    esac
done

case "$BOARD" in
    ''|.*|*/*) refuse "--board $BOARD: give the name of a folder in tests/fixtures/boards" ;;
esac
# JetPack's torch release (PyPI's aarch64 wheel of it is a CPU build), NVIDIA's version string
# of it, and the L4T revision of that JetPack (R36.<revision>)
case "$JETPACK" in
    6.0) TORCH=2.3.0; JETPACK_TORCH=2.3.0a0+40ec155e58.nv24.03; L4T_REVISION=3.0 ;;
    6.1) TORCH=2.5.0; JETPACK_TORCH=2.5.0a0+872d972e41.nv24.08; L4T_REVISION=4.4 ;;
    *) refuse "--jetpack $JETPACK: give 6.0 or 6.1" ;;
esac
ROOTFS=${ROOTFS:-$KEEP/jp$JETPACK}

# trusted DIR WHAT UID...: refuse DIR (what the message calls it) unless no user but the UIDs can
# change it or what leads to it; see the top. It may not exist yet (made below, by root). Each
# folder on the way is looked at as written, from / down to the first not there yet (a relative
# DIR from the real working folder): first for a link anywhere (a trailing slash, or a .. after
# it, would follow it), then for its owner and who may write it.
trusted() {
    local dir=$1 what=$2 path part at="" i last owner mode
    local -a parts=()
    shift 2
    case "$dir" in /*) path=$dir ;; *) path=$(pwd -P)/$dir ;; esac
    local rest=$path
    while [ -n "$rest" ]; do  # its names between slashes, but for empty ones and .
        part=${rest%%/*}
        if [ "$part" = "$rest" ]; then rest=""; else rest=${rest#*/}; fi
        case "$part" in '' | .) ;; *) parts+=("$part") ;; esac
    done
    last=$((${#parts[@]} - 1))
    local -a ats=()  # /, then each folder below it as written, down to the first not there
    for ((i = -1; i <= last; i++)); do
        if ((i < 0)); then at=/; else at=${at%/}/${parts[i]}; fi
        if [ -L "$at" ] && ((i == last)); then
            refuse "$what $path is a symbolic link: give the folder it points to"
        elif [ -L "$at" ]; then
            refuse "$what $path is inside $at, which is a symbolic link: give one without"
        fi
        [ -e "$at" ] || break  # nothing below it exists either
        ats+=("$at")
    done
    for ((i = 0; i < ${#ats[@]}; i++)); do  # none of them a link: stat's own answer is theirs
        at=${ats[i]}
        read -r owner mode < <(stat -c '%u %a' -- "$at")
        if ((i == last + 1)); then  # DIR itself
            [ -d "$at" ] || refuse "$what $path is not a folder"
            owned_by "$owner" "$@" || refuse "$what $path is not owned by root: give one root made"
            (((8#$mode & 8#022) == 0)) || refuse "$what $path can be written by other users"
        else
            [ -d "$at" ] || refuse "$what $path is inside $at, which is not a folder"
            owned_by "$owner" "$@" || refuse "$what $path is inside $at, which is not root's"
            (((8#$mode & 8#022) == 0 || (8#$mode & 8#1000) != 0)) \
                || refuse "$what $path is inside $at, which other users can write"
        fi
    done
}
owned_by() {
    local owner=$1 uid
    shift
    for uid in "$@"; do [ "$owner" = "$uid" ] && return 0; done
    return 1
}
trusted "$ROOTFS" "the arm64 root" 0
trusted "$OUT" "the log folder (--out)" 0 ${SUDO_UID:+"$SUDO_UID"}
[ "$(id -u)" = 0 ] || die "it needs root (debootstrap, chroot, binfmt_misc): run it with sudo"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"
QEMU_CONF=/usr/lib/binfmt.d/qemu-aarch64.conf
[ -f "$QEMU_CONF" ] || die "qemu-user-static is missing: apt-get install qemu-user-static"
[ -d "$SRC/tests/fixtures/boards/$BOARD" ] || die "no board $BOARD in tests/fixtures/boards"

# The mounts further down (proc, sys, dev inside the arm64 root) are made in a mount namespace
# of the script's own: however it ends, killed included, they go with it, and never outlive it
# in a folder someone may delete later. Where no namespace can be made, it does not run.
if [ "${EDGERL_ARM64_NS:-}" != 1 ]; then
    unshare --mount --propagation private true 2>/dev/null \
        || die "it needs a mount namespace of its own (unshare --mount), so that no mount outlives it"
    EDGERL_ARM64_NS=1 exec unshare --mount --propagation private bash "$0" "${ARGS[@]}"
fi
if [ "$ROOTFS" = "$KEEP/jp$JETPACK" ] && [ ! -d "$KEEP" ]; then
    mkdir -m 0700 "$KEEP"
fi
(umask 022 && mkdir -p "$OUT" "$ROOTFS")  # 0755, the folders above them made too
# Checked again as made: in a sticky folder another user could have made one first.
trusted "$ROOTFS" "the arm64 root" 0
trusted "$OUT" "the log folder (--out)" 0 ${SUDO_UID:+"$SUDO_UID"}
OUT=$(cd "$OUT" && pwd)
printf 'step\tseconds\tstatus\n' >"$OUT/steps.tsv"

# Each step: its output in $OUT/<name>.log, its time and exit status in steps.tsv.
step() {
    local name=$1; shift
    local start=$SECONDS rc=0
    echo "arm64_check: $name ..."
    "$@" >"$OUT/$name.log" 2>&1 || rc=$?
    printf '%s\t%d\t%d\n' "$name" $((SECONDS - start)) "$rc" >>"$OUT/steps.tsv"
    echo "arm64_check: $name: exit $rc after $((SECONDS - start)) s"
    if [ "$rc" != 0 ]; then
        tail -20 "$OUT/$name.log" >&2
        die "$name failed (all of it: $OUT/$name.log)"
    fi
}

# arm64 binaries run through qemu: binfmt_misc mounted and qemu-aarch64 registered (a container
# or a machine without systemd-binfmt has neither).
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    cat "$QEMU_CONF" >/proc/sys/fs/binfmt_misc/register
fi

if [ ! -f "$ROOTFS/etc/debian_version" ]; then
    step debootstrap debootstrap --arch=arm64 --variant=minbase \
        --include=python3,python3-venv,python3-pip,python3-dev,ca-certificates,procps,passwd \
        bookworm "$ROOTFS" "$MIRROR"
fi
# This machine's extra certificate authorities (a TLS-inspecting proxy's) and name servers
# The folders written through below are the root's own, never links it may have grown.
for d in etc usr/local/share/ca-certificates board src runs opt proc sys dev; do
    [ ! -L "$ROOTFS/$d" ] || die "$ROOTFS/$d is a symbolic link: remove the arm64 root and run again"
done
cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/" 2>/dev/null \
    || true
rm -f "$ROOTFS/etc/resolv.conf"  # a link is removed, not followed
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"

# In the script's own namespace (above): they end with it.
for m in proc sys dev; do
    if ! mountpoint -q "$ROOTFS/$m"; then
        if [ "$m" = proc ]; then
            mount -t proc proc "$ROOTFS/proc"
        else
            mount --rbind "/$m" "$ROOTFS/$m"  # with /dev/pts and /dev/shm
        fi
    fi
done

# Inside the arm64 root: a clean environment (no pip settings of this machine), the board's files
inside() {
    chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 EDGERL_HW_ROOT=/board "$@"
}
step certificates inside update-ca-certificates

HAS_TORCH=$(inside python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
# (a run stopped before the relabelling left PyPI's own version string: relabelled below)
if [ -n "$HAS_TORCH" ] && [ "$HAS_TORCH" != "$JETPACK_TORCH" ] && [ "$HAS_TORCH" != "$TORCH" ]; then
    die "$ROOTFS holds torch $HAS_TORCH, not JetPack $JETPACK's: give each JetPack its own --root"
fi
if [ -z "$HAS_TORCH" ]; then
    step torch inside python3 -m pip install --break-system-packages --no-cache-dir \
        --progress-bar off "torch==$TORCH" "numpy==$NUMPY"
fi
# The relabelling: torch's own version and its distribution's metadata say JetPack's string.
step relabel inside python3 - "$JETPACK_TORCH" <<'PY'
import importlib.metadata as md, pathlib, re, sys
label = sys.argv[1]
dist = md.distribution("torch")
info = pathlib.Path(dist._path)
if dist.version != label:
    meta = info / "METADATA"
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {label}", meta.read_text()))
    version_py = pathlib.Path(dist.locate_file("torch/version.py"))
    text = re.sub(r"(?m)^__version__ = .*$", f"__version__ = '{label}'", version_py.read_text())
    version_py.write_text(text)
    info.rename(info.with_name(f"torch-{label}.dist-info"))
print("torch", md.version("torch"))
PY

rm -rf "$ROOTFS/board" "$ROOTFS/src/edgerl" "$ROOTFS/runs" "$ROOTFS/opt/edgerl"  # a fresh install
cp -r "$SRC/tests/fixtures/boards/$BOARD" "$ROOTFS/board"
sed -i "s/REVISION: [0-9.]*/REVISION: $L4T_REVISION/" "$ROOTFS/board/etc/nv_tegra_release"
mkdir -p "$ROOTFS/src/edgerl" "$ROOTFS/runs"
# The work tree's tracked files, as they are now (root may not own the checkout: safe.directory)
copy_source() {
    git -C "$SRC" -c safe.directory="$SRC" ls-files -z \
        | tar -C "$SRC" --null --no-recursion -T - -cf - \
        | tar -xf - -C "$ROOTFS/src/edgerl"
}
step source copy_source

inside python3 -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])' \
    >"$OUT/platform.txt"
step install inside env EDGERL_TORCH_WITHOUT_CUDA=1 bash /src/edgerl/scripts/install.sh
VENV=/opt/edgerl/venv
# With the install's pins (JetPack's NumPy stays). ONNX Runtime 1.28 and newer crash on import
# under Debian 12's qemu 7.2 (SIGSEGV; 1.19 to 1.26 import and run), which says nothing of a real
# arm64 CPU; a Jetson takes NVIDIA's onnxruntime-gpu anyway (docs/install.md).
step onnx-extra inside "$VENV/bin/pip" install --no-cache-dir --progress-bar off \
    -c /opt/edgerl/constraints.txt onnx 'onnxruntime<1.27'
# doctor's verdict on an emulated board (no GPU, no clocks to set) is kept, not required
step doctor inside sh -c 'edgerl doctor; echo "doctor exit status: $?"'
# Emulated, CartPole learns at 2 steps/s (an MLP update takes about a second): 500 steps of
# learning after the preset's 1,000. A Pong update takes over a minute: 2 of them, after 292
# steps of 4 environments played.
step cartpole inside edgerl train --env CartPole-v1 --steps 1500 --run-dir /runs/cartpole \
    --set train.log_every_s=30
step pong inside edgerl train --env ALE/Pong-v5 --steps 300 --run-dir /runs/pong \
    --set agent.learning_starts=292 --set train.log_every_s=30
step export inside edgerl export --onnx --run-dir /runs/cartpole
step play inside edgerl play --run-dir /runs/cartpole --episodes 3 --json
step play-pong inside edgerl play --run-dir /runs/pong --episodes 1 --json
cp "$OUT/steps.tsv" "$OUT/steps.done.tsv"
echo "arm64_check: every step passed; times in $OUT/steps.tsv"
