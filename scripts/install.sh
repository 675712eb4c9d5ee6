#!/usr/bin/env bash
# Install edgerl as a systemd service (see docs/install.md and docs/service.md).
#
# On a Jetson the virtual environment is created with --system-site-packages so that JetPack's
# PyTorch and TensorRT are used, and pip is pinned to their versions so it never replaces them.
# Idempotent: run it again to upgrade. --uninstall removes the units and the venv, keeps config
# (/etc/edgerl) and runs (/var/lib/edgerl). The unit of the web page (edgerl-serve.service) is
# installed with its token, not enabled. --fleet makes the board part of a fleet (docs/fleet.md):
# Ray in the venv, the Ray node's unit (not enabled), its role file and a fleet token, and the
# learner's drop-in. Off a Jetson PyTorch's build is chosen before the download as `make run`
# chooses it (scripts/install_torch.sh; TORCH=spec and TORCH_INDEX=URL as the Makefile's).
set -euo pipefail

usage() {
    cat <<USAGE
usage: scripts/install.sh [--prefix DIR] [--dry-run] [--no-venv] [--python PY] [--fleet]
                          [--uninstall]

  --prefix DIR   install below DIR instead of / (no systemctl, no group): for packaging and tests
  --dry-run      print what would be done, change nothing
  --no-venv      install the unit, config and state directory only
  --python PY    the Python that creates the venv (default: python3)
  --fleet        also Ray, edgerl-ray.service, /etc/edgerl/ray.env, a fleet token and the
                 learner's drop-in: this board joins a fleet (docs/fleet.md)
  --uninstall    remove the units and the venv; keep /etc/edgerl and /var/lib/edgerl
USAGE
}

PREFIX=/
DRY_RUN=0
NO_VENV=0
UNINSTALL=0
FLEET=0
PYTHON=${PYTHON:-python3}
SRC=$(cd "$(dirname "$0")/.." && pwd)

refuse() { echo "edgerl-install: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ -n "${2-}" ] || refuse "--prefix needs a directory"; PREFIX=$2; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --no-venv) NO_VENV=1; shift ;;
        --python) PYTHON=${2:?--python needs an interpreter}; shift 2 ;;
        --uninstall) UNINSTALL=1; shift ;;
        --fleet) FLEET=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "edgerl-install: error: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

# The prefix goes into the unit files as it is (ExecStart=, Documentation=): systemd splits a
# line at spaces and reads %, $ and quotes, and the sed that writes it reads # and &. So it is
# a plain path, or refused.
case "$PREFIX" in
    /*) ;;
    *) refuse "--prefix $PREFIX: give an absolute path" ;;
esac
if [[ ! "$PREFIX" =~ ^[A-Za-z0-9._/+-]+$ ]]; then
    refuse "--prefix ${PREFIX@Q}: give a path of letters, digits and . _ + - / only (the unit files take it as it is)"
fi
ROOT=${PREFIX%/}
OPT=$ROOT/opt/edgerl
VENV=$OPT/venv
UNIT=$ROOT/etc/systemd/system/edgerl.service
SERVE_UNIT=$ROOT/etc/systemd/system/edgerl-serve.service
RAY_UNIT=$ROOT/etc/systemd/system/edgerl-ray.service
DROP_IN=$ROOT/etc/systemd/system/edgerl.service.d/fleet.conf
CONF_DIR=$ROOT/etc/edgerl
STATE_DIR=$ROOT/var/lib/edgerl
LINK=$ROOT/usr/local/bin/edgerl  # so `edgerl status` works in any shell, not only in the venv
HW_ROOT=${EDGERL_HW_ROOT:-/}
SYSTEM=0
[ "$PREFIX" = / ] && SYSTEM=1

say() { echo "edgerl-install: $*"; }
die() { echo "edgerl-install: error: $*" >&2; exit 1; }
run() {
    echo "+ $*"
    if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}
is_jetson() { [ -f "${HW_ROOT%/}/etc/nv_tegra_release" ]; }

if [ "$SYSTEM" = 1 ] && [ "$DRY_RUN" = 0 ] && [ "$(id -u)" != 0 ]; then
    die "installing the service needs root: run it with sudo"
fi

if [ "$UNINSTALL" = 1 ]; then
    if [ "$SYSTEM" = 1 ] && command -v systemctl >/dev/null; then
        run systemctl disable --now edgerl.service || true
        run systemctl disable --now edgerl-serve.service || true
        if [ -e "$RAY_UNIT" ]; then
            run systemctl disable --now edgerl-ray.service || true
        fi
    fi
    run rm -f "$UNIT" "$SERVE_UNIT" "$RAY_UNIT" "$DROP_IN"
    if [ -d "$(dirname "$DROP_IN")" ]; then
        run rmdir --ignore-fail-on-non-empty "$(dirname "$DROP_IN")"
    fi
    if [ -L "$LINK" ] && [ "$(readlink "$LINK")" = "$VENV/bin/edgerl" ]; then
        run rm -f "$LINK"
    fi
    run rm -rf "$VENV" "$OPT/README.md" "$OPT/docs" "$OPT/constraints.txt"
    if [ "$SYSTEM" = 1 ] && command -v systemctl >/dev/null; then
        run systemctl daemon-reload
    fi
    say "removed the units and $VENV; kept $CONF_DIR (config) and $STATE_DIR (runs)"
    exit 0
fi

EXTRAS=web
[ "$FLEET" = 1 ] && EXTRAS=web,fleet  # Ray (about 0.25 GB)

install_venv() {
    if is_jetson; then
        say "Jetson ($(head -c 60 "${HW_ROOT%/}/etc/nv_tegra_release")): using JetPack's torch"
        run "$PYTHON" -m venv --system-site-packages "$VENV"
        local check='import torch; assert torch.cuda.is_available(), "no CUDA"'
        # EDGERL_TORCH_WITHOUT_CUDA=1: an emulated board (scripts/arm64_check.sh), whose
        # stand-in for JetPack's torch is a CPU build
        if [ "${EDGERL_TORCH_WITHOUT_CUDA:-0}" = 1 ]; then
            say "EDGERL_TORCH_WITHOUT_CUDA=1: not asking JetPack's torch for CUDA"
        elif [ "$DRY_RUN" = 0 ] && ! "$VENV/bin/python" -c "$check" 2>/dev/null; then
            die "JetPack's PyTorch with CUDA was not found (torch.cuda.is_available() is not True in
  $PYTHON). Install NVIDIA's PyTorch wheel for your JetPack, as described in
  https://docs.nvidia.com/deeplearning/frameworks/install-pytorch-jetson-platform/index.html
  (for example: pip3 install --no-cache https://developer.download.nvidia.com/compute/redist/jp/...),
  check with: python3 -c 'import torch; print(torch.cuda.is_available())', then run this again."
        fi
        # JetPack's torch, TensorRT and NumPy stay (the script says why this is no plain pip install)
        run "$VENV/bin/python" "$SRC/scripts/jetpack_pip.py" --quiet \
            --constraints "$OPT/constraints.txt" --extras "jetson,$EXTRAS" "$SRC"
    else
        # PyTorch's build chosen before the download, as `make run` chooses it: the CPU build
        # (190 MB) where no NVIDIA GPU is here, PyPI's CUDA build (several GB) where one is;
        # TORCH_INDEX=URL takes it from that index. No --quiet: the downloads show progress.
        say "not a Jetson: a plain venv, PyTorch's build chosen for this machine"
        run "$PYTHON" -m venv "$VENV"
        run bash "$SRC/scripts/install_torch.sh" "$VENV/bin" "${TORCH:-torch}" "${TORCH_INDEX:-auto}"
        run "$VENV/bin/pip" install "${SRC}[$EXTRAS]"
    fi
}

# The trainer runs as this unprivileged system user (systemd/README.md); its group's members
# may watch runs. The unit names the video and render groups the GPU needs; jtop's group exists
# only with jetson-stats, so it is joined here when it is there (a group the unit names that
# does not exist would stop the service from starting).
ensure_service_user() {
    if ! getent group edgerl >/dev/null; then
        run groupadd --system edgerl
    fi
    if ! getent passwd edgerl >/dev/null; then
        run useradd --system --gid edgerl --home-dir /var/lib/edgerl --no-create-home \
            --shell /usr/sbin/nologin --comment "edgerl training service" edgerl
    fi
    if getent group jtop >/dev/null; then
        run usermod -aG jtop edgerl
    fi
}

run mkdir -p "$OPT"
if [ "$NO_VENV" = 0 ]; then
    install_venv
fi
# The command on PATH: a link into the venv. Anything else already there is left alone.
if [ -e "$LINK" ] && ! [ -L "$LINK" ]; then
    say "keeping $LINK (not ours): run $VENV/bin/edgerl, or put $VENV/bin on PATH"
else
    run mkdir -p "$(dirname "$LINK")"
    run ln -sfn "$VENV/bin/edgerl" "$LINK"
fi
run install -m 0644 "$SRC/README.md" "$OPT/README.md"
run install -d -m 0755 "$OPT/docs"
run install -m 0644 "$SRC"/docs/*.md "$OPT/docs/"  # the README's links, next to it

UNITS=(edgerl edgerl-serve)
[ "$FLEET" = 1 ] && UNITS+=(edgerl-ray)
for name in "${UNITS[@]}"; do
    target=$ROOT/etc/systemd/system/$name.service
    echo "+ write $target (paths under $OPT)"
    if [ "$DRY_RUN" = 0 ]; then
        mkdir -p "$(dirname "$target")"
        sed "s#/opt/edgerl#$OPT#g" "$SRC/systemd/$name.service" >"$target.tmp"
        chmod 0644 "$target.tmp"
        mv "$target.tmp" "$target"
    fi
done

if [ -e "$CONF_DIR/edgerl.toml" ]; then
    say "keeping the existing $CONF_DIR/edgerl.toml"
else
    run install -D -m 0644 "$SRC/systemd/edgerl.toml.example" "$CONF_DIR/edgerl.toml"
fi
run install -d -m 0751 "$STATE_DIR"
# The token the web page wants (edgerl-serve.service listens beyond the board): root's alone;
# systemd hands it to the service. Kept when it is there.
TOKEN=$CONF_DIR/serve-token
if [ -e "$TOKEN" ]; then
    say "keeping the existing $TOKEN"
else
    echo "+ write $TOKEN (a new random token, mode 0600)"
    if [ "$DRY_RUN" = 0 ]; then
        mkdir -p "$CONF_DIR"
        (umask 077 && head -c 24 /dev/urandom | base64 | tr '+/' '-_' >"$TOKEN")
    fi
fi

# The fleet (docs/fleet.md): this board's role (the learner's head by default), the token every
# node must hold (one board's, copied to the others: a node without it cannot join; whoever has
# it can run code on every board, so it is the edgerl user's alone, not its group's, whose
# members only watch runs), and the learner's drop-in that gives edgerl.service the network to
# the fleet's subnet only. Each is kept when it is there: the user edits all three.
RAY_TOKEN=$CONF_DIR/ray-token
NEW_RAY_TOKEN=0
if [ "$FLEET" = 1 ]; then
    if [ -e "$CONF_DIR/ray.env" ]; then
        say "keeping the existing $CONF_DIR/ray.env"
    else
        run install -D -m 0644 "$SRC/systemd/ray.env.example" "$CONF_DIR/ray.env"
    fi
    if [ -e "$RAY_TOKEN" ]; then
        say "keeping the existing $RAY_TOKEN"
    else
        NEW_RAY_TOKEN=1
        echo "+ write $RAY_TOKEN (a new random token, mode 0600)"
        if [ "$DRY_RUN" = 0 ]; then
            mkdir -p "$CONF_DIR"
            (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$RAY_TOKEN")
        fi
    fi
    if [ -e "$DROP_IN" ]; then
        say "keeping the existing $DROP_IN"
    else
        run install -D -m 0644 "$SRC/systemd/edgerl.service.d/fleet.conf" "$DROP_IN"
    fi
fi

if [ "$SYSTEM" = 1 ]; then
    ensure_service_user
    run chgrp edgerl "$STATE_DIR"
    if [ "$NEW_RAY_TOKEN" = 1 ]; then
        run chown edgerl:edgerl "$RAY_TOKEN"  # the Ray node and the learner run as edgerl
    fi
    if command -v systemctl >/dev/null; then
        run systemctl daemon-reload
    fi
else
    say "prefix install: no systemctl, no edgerl group"
fi

if [ "$DRY_RUN" = 1 ]; then
    say "dry run: nothing was installed or changed (the steps above are what an install does);"
    say "after an install: First check this machine: edgerl doctor --deep (that is $LINK)"
else
    say "installed. First check this machine: edgerl doctor --deep (that is $LINK)"
fi
say "then start now and at boot with: sudo systemctl enable --now edgerl"
say "watch it with: edgerl status, journalctl -u edgerl -f, edgerl view"
say "or from a browser: sudo systemctl enable --now edgerl-serve (port 8765, the token in $TOKEN)"
if [ "$FLEET" = 1 ]; then
    say "fleet (step by step: $OPT/docs/fleet.md): give every board the same $RAY_TOKEN;"
    say "  on the learner's board: the fleet's subnet in $DROP_IN, then"
    say "  sudo systemctl enable --now edgerl-ray edgerl;"
    say "  on a board of actors only: RAY_START_ARGS in $CONF_DIR/ray.env joins the learner's"
    say "  head, then sudo systemctl enable --now edgerl-ray (edgerl itself stays off there)"
fi
