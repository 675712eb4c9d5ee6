"""`edgerl doctor`: the real command on this machine, on stand-in Jetsons, and with --deep."""

from __future__ import annotations

import grp
import importlib.util
import json
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import torch

from edgerl.doctor import board
from edgerl.doctor.core import STATUSES
from edgerl.doctor.deep_state import DeepState
from edgerl.doctor.modes import Mode, check_update, update_modes

from .conftest import FIXTURES, run_edgerl

SMALL_REPLAY = ("--set", "replay.capacity=20000")  # the checks, not this machine's free memory


def checks_of(out: str) -> dict[str, dict]:
    doc = json.loads(out)
    return {c["name"]: c for c in doc["checks"]}


@pytest.fixture
def as_root(monkeypatch):
    """Run the checks as if by root (or not), whoever runs the tests."""

    def set_root(root: bool) -> None:
        monkeypatch.setattr(board, "effective_root", lambda: root)

    set_root(True)
    return set_root


@pytest.fixture
def orin(fake_jetson, tmp_path, monkeypatch):
    """The stand-in Jetson with an AGX Orin's files (L4T 36.4.4, JetPack 6.1/6.2)."""
    root = tmp_path / "orin"
    shutil.copytree(FIXTURES / "boards" / "agx_orin_jp6", root)
    monkeypatch.setenv("EDGERL_HW_ROOT", str(root))
    return fake_jetson


def test_this_machine_has_no_failing_check(cli):
    level = logging.getLogger("edgerl").level
    r = cli("doctor", *SMALL_REPLAY)
    assert r.code == 0, r.out
    assert logging.getLogger("edgerl").level == level  # quiet while checking, then as it was
    lines = r.out.splitlines()
    assert lines[-1].startswith("edgerl doctor: ") and "nothing failed" in lines[-1]
    statuses = [line.split()[0] for line in lines[:-1]]
    assert set(statuses) <= set(STATUSES) and "fail" not in statuses
    by_name = {line.split()[1]: line for line in lines[:-1]}
    assert by_name["torch"].startswith("pass") and torch.__version__ in by_name["torch"]
    assert by_name["game"].startswith("pass") and "ALE/Pong-v5" in by_name["game"]
    # The tests run with SDL_VIDEODRIVER=dummy: SDL opens it, but nobody would see a window.
    assert by_name["display"].startswith("warn") and "'dummy' driver" in by_name["display"]


def test_json_document(cli):
    r = cli("doctor", "--json", *SMALL_REPLAY)
    doc = json.loads(r.out)
    assert doc["deep"] is False and doc["ok"] is (r.code == 0) and doc["exit_code"] == r.code
    names = [c["name"] for c in doc["checks"]]
    assert len(names) == len(set(names))
    for name in ("config", "python", "torch", "cuda", "precision", "replay memory", "run dir"):
        assert name in names
    for c in doc["checks"]:
        assert set(c) == {"name", "status", "found", "fix", "data"}
        assert c["status"] in STATUSES and c["found"]
        if c["status"] in ("fail", "warn"):
            assert c["fix"], f"{c['name']} says what is wrong but not what to do"
    assert doc["counts"] == {s: sum(c["status"] == s for c in doc["checks"]) for s in STATUSES}
    precision = checks_of(r.out)["precision"]["data"]
    assert precision["device"] == "cpu" and precision["amp"] is None
    assert precision["cuda_graphs"] is False


def test_a_supported_jetson(orin, as_root, cli):
    r = cli("doctor", "--json", *SMALL_REPLAY)
    checks = checks_of(r.out)
    assert checks["board"]["status"] == "pass"
    assert "L4T 36.4.4 (JetPack 6.1/6.2)" in checks["board"]["found"]
    assert checks["jetson_clocks"]["status"] == "pass"
    assert "clocks dynamic, power mode 5W" in checks["jetson_clocks"]["found"]
    assert checks["tegrastats"]["status"] == "pass"
    assert checks["tegrastats"]["data"]["record"]["ram_total_mb"] > 0
    assert checks["nvpmodel"]["status"] == "pass"
    assert "power mode MAXN (0)" in checks["nvpmodel"]["found"]
    # Looking never changes anything: only --show, -q and tegrastats itself were run.
    assert orin.calls("jetson_clocks") == [["--show"]]
    assert orin.calls("nvpmodel") == [["-q"]]
    assert not (orin.state / "clocks.maxed").exists()
    # A Jetson whose torch has no CUDA does not use its GPU: that fails, and says what to do.
    if torch.version.cuda is None:
        assert (
            checks["cuda"]["status"] == "fail" and "NVIDIA's PyTorch wheel" in checks["cuda"]["fix"]
        )
        assert r.code == 1


def _tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_an_unsupported_jetson_with_broken_tools(fake_jetson, as_root, cli, tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    broken.mkdir()
    _tool(broken, "jetson_clocks", "echo 'Error: cannot read clocks' >&2\nexit 1\n")
    _tool(broken, "tegrastats", "echo 'not a load line'\nexit 0\n")
    monkeypatch.setenv("PATH", f"{broken}{os.pathsep}{os.environ['PATH']}")
    r = cli(
        "doctor",
        "--json",
        *SMALL_REPLAY,
        "--set",
        "hw.nvpmodel=MAXN",
        "--set",
        "hw.nvpmodel_cmd=/nonexistent/nvpmodel",
    )
    assert r.code == 1
    checks = checks_of(r.out)
    assert checks["board"]["status"] == "fail"
    assert "L4T 32.7.1 (JetPack 4) is not supported" in checks["board"]["found"]
    assert (
        "Supported platforms" in checks["board"]["fix"]
        and "train elsewhere" in checks["board"]["fix"]
    )
    assert checks["jetson_clocks"]["status"] == "fail"
    assert "cannot read clocks" in checks["jetson_clocks"]["found"]
    assert checks["tegrastats"]["status"] == "fail"
    assert "printed no tegrastats line" in checks["tegrastats"]["found"]
    assert checks["nvpmodel"]["status"] == "fail"
    assert "hw.nvpmodel_cmd" in checks["nvpmodel"]["fix"]


def test_a_power_mode_the_board_does_not_have_fails(fake_jetson, as_root, cli):
    r = cli("doctor", "--json", *SMALL_REPLAY, "--set", "hw.nvpmodel=10W")
    nvpmodel = checks_of(r.out)["nvpmodel"]
    assert nvpmodel["status"] == "fail" and "MAXN (0), 5W (1)" in nvpmodel["found"]


def test_not_root_is_told_who_may_run_jetson_clocks(fake_jetson, as_root, cli):
    as_root(False)
    r = cli("doctor", "--json", *SMALL_REPLAY)
    clocks = checks_of(r.out)["jetson_clocks"]
    assert clocks["status"] == "warn" and "only root may run it" in clocks["found"]
    assert "sudo" in clocks["fix"]
    assert fake_jetson.calls("jetson_clocks") == []


@pytest.mark.parametrize(
    ("l4t", "release", "supported"),
    [
        ("32.7.1", "JetPack 4", False),
        ("35.4.1", "JetPack 5", False),
        ("36.3.0", "JetPack 6.0", True),
        ("36.4.4", "JetPack 6.1/6.2", True),
        ("38.4.0", "JetPack 7", True),
        ("36.0", "L4T 36.0", None),
    ],
)
def test_l4t_releases_map_to_the_supported_platforms(l4t, release, supported):
    found = board.jetpack(l4t)
    assert (found.jetpack, found.supported) == (release, supported)
    assert bool(found.way_forward) == (supported is False)


@pytest.mark.parametrize(
    ("version", "status"), [("2.1.2", "fail"), ("2.3.0a0+ebedce2.nv24.02", "pass")]
)
def test_torch_is_judged_by_the_floor(cli, monkeypatch, version, status):
    monkeypatch.setattr(torch, "__version__", version)
    r = cli("doctor", "--json", *SMALL_REPLAY)
    checks = checks_of(r.out)
    assert checks["torch"]["status"] == status and version in checks["torch"]["found"]
    if status == "fail":
        assert r.code == 1
        assert "PyTorch 2.3 or newer" in checks["torch"]["fix"]
        assert checks["cuda"]["status"] == "skip"


def test_a_run_dir_that_cannot_be_made_fails(tmp_path):
    (tmp_path / "a-file").write_text("")
    r = run_edgerl("doctor", *SMALL_REPLAY, "--set", f"train.run_dir={tmp_path / 'a-file' / 'run'}")
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if x.split()[1:3] == ["run", "dir"])
    assert line.startswith("fail") and "is not a directory" in line and "train.run_dir" in line
    assert "Traceback" not in r.stderr


def test_a_replay_that_does_not_fit_fails_with_the_capacity_that_would(cli):
    r = cli("doctor", "--json", "--set", "replay.capacity=2000000000")
    assert r.code == 1
    replay = checks_of(r.out)["replay memory"]
    assert replay["status"] == "fail" and "set replay.capacity to at most" in replay["fix"]


def test_with_pqn_the_memory_line_is_the_rollout_not_a_replay(cli, tmp_path):
    # PQN keeps no replay: a config file's capacity is not used (a --set of it is refused, as
    # train refuses it: the config line fails)
    config = tmp_path / "edgerl.toml"
    config.write_text("[agent]\nalgo = 'pqn'\n[replay]\ncapacity = 2000000000\n")
    r = cli("doctor", "--json", "--config", config)
    memory = checks_of(r.out)["replay memory"]
    assert memory["status"] == "pass", memory
    assert "a rollout of" in memory["found"] and "(no replay)" in memory["found"]
    assert memory["data"]["algo"] == "pqn"
    r = cli("doctor", "--json", "--set", "agent.algo=pqn", "--set", "replay.capacity=2000000000")
    assert checks_of(r.out)["config"]["status"] == "fail"
    r = cli("doctor", "--json", "--set", "agent.algo=pqn", "--set", "pqn.rollout_steps=10000")
    memory = checks_of(r.out)["replay memory"]
    assert memory["status"] == "fail" and "lower env.num_envs" in memory["fix"], memory


def test_the_cuda_line_judges_the_device_training_would_use(cli):
    """``perf.device=cuda`` without a usable GPU is refused by `edgerl train`: the doctor says
    so too (it judged ``auto`` whatever the config said); ``cpu`` is a choice, not a fault."""
    r = cli("doctor", "--json", *SMALL_REPLAY, "--set", "perf.device=cpu")
    cuda = checks_of(r.out)["cuda"]
    assert cuda["status"] == "skip" and cuda["found"] == "perf.device=cpu: trains on the CPU"
    assert checks_of(r.out)["precision"]["data"]["device"] == "cpu"
    if torch.cuda.is_available():
        return  # a GPU here: perf.device=cuda is usable
    r = cli("doctor", "--json", *SMALL_REPLAY, "--set", "perf.device=cuda")
    cuda = checks_of(r.out)["cuda"]
    assert r.code != 0 and cuda["status"] == "fail"
    assert "perf.device=cuda but no usable CUDA GPU was found" in cuda["found"] and cuda["fix"]


def test_more_torch_threads_than_free_cpus_is_a_warning_with_the_fix(cli):
    r = cli("doctor", "--json", *SMALL_REPLAY, "--set", "perf.threads=256")
    threads = checks_of(r.out)["cpu threads"]
    assert threads["status"] == "warn" and "PyTorch runs 256 threads" in threads["found"]
    assert threads["fix"] == "perf.threads=0" and threads["data"]["threads"] == 256
    r = cli("doctor", "--json", *SMALL_REPLAY)
    threads = checks_of(r.out)["cpu threads"]
    assert "(auto)" in threads["found"] and threads["data"]["setting"] == 0


def test_a_broken_config_is_a_line_and_the_rest_still_runs(cli):
    r = cli("doctor", "--json", "--set", "agent.lr=fast")
    assert r.code == 1
    checks = checks_of(r.out)
    assert checks["config"]["status"] == "fail" and "agent.lr" in checks["config"]["found"]
    assert checks["torch"]["status"] == "pass"


def test_a_key_the_learner_never_reads_fails_as_train_refuses_it(cli):
    r = cli("doctor", "--json", "--set", "ppo.clip=0.1")
    assert r.code == 1
    config = checks_of(r.out)["config"]
    assert config["status"] == "fail"
    assert "--set ppo.clip does nothing with agent.algo=dqn" in config["found"]
    r = cli("doctor", "--json", "--set", "agent.algo=ppo", "--set", "ppo.clip=0.1")
    assert checks_of(r.out)["config"]["status"] == "pass"


def _groups() -> tuple[str | None, str | None]:
    """A group this process is in, and one it is not in (by id or by name)."""
    mine = {os.getgid(), *os.getgroups()}
    member = next((g.gr_name for g in grp.getgrall() if g.gr_gid in mine), None)
    other = next((g.gr_name for g in grp.getgrall() if g.gr_gid not in mine and not g.gr_mem), None)
    return member, other


def test_group_membership(cli, as_root):
    as_root(False)
    member, other = _groups()
    if member is None or other is None:
        pytest.skip("needs a group this user is in and one it is not in")
    r = cli("doctor", "--json", *SMALL_REPLAY, "--set", f"display.group={member}")
    assert checks_of(r.out)["edgerl group"]["status"] == "pass"
    r = cli("doctor", "--json", *SMALL_REPLAY, "--set", f"display.group={other}")
    group = checks_of(r.out)["edgerl group"]
    assert group["status"] == "warn" and f"usermod -aG {other}" in group["fix"]


def test_deep_runs_real_updates_and_checks_the_onnx_export():
    r = run_edgerl("doctor", "--deep", "--json", *SMALL_REPLAY, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["deep"] is True
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["replay"]["status"] == "pass" and "ALE/Pong-v5" in checks["replay"]["found"]
    eager = checks["update/eager"]
    assert eager["status"] == "pass" and eager["data"]["moved"] > 0
    assert len(eager["data"]["losses"]) == 3
    channels_last = checks["update/channels_last"]
    assert channels_last["status"] == "pass" and channels_last["data"]["reference"] == "eager"
    onnx = checks["onnx export"]
    assert onnx["status"] == "pass" and onnx["data"]["agreement"]["ok"]
    assert onnx["data"]["agreement"]["max_abs_diff"] <= 1e-4
    assert onnx["data"]["agreement"]["total"] == 32
    if not torch.cuda.is_available():
        assert checks["tensorrt engine"]["status"] == "skip"
        assert checks["onnx on the gpu"]["status"] == "skip"
        assert not any(name.startswith("update/graph") for name in checks)


def test_deep_with_pqn_learns_from_a_real_rollout_and_exports_its_network():
    from edgerl.config import Config, with_values
    from edgerl.doctor.core import Context
    from edgerl.doctor.deep import check_onnx_export, check_rollout

    cfg = with_values(Config(), {"agent.algo": "pqn"})
    ctx = Context(cfg, device=torch.device("cpu"), torch_ok=True)
    state = DeepState(torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        state.workdir = Path(tmp)
        rollout = check_rollout(ctx, state)
        assert rollout.status == "pass", rollout.found
        assert "PQN" in rollout.found and rollout.data["moved"] > 0  # built as training builds it
        exported = check_onnx_export(ctx, state)
        assert exported.status == "pass", exported.found  # the LayerNorm network, in ORT
        assert exported.data["agreement"]["ok"]
    assert "replay" not in state.outcomes and "eager" not in state.outcomes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_deep_on_the_gpu_runs_every_mode_and_they_agree():
    r = run_edgerl("doctor", "--deep", "--json", *SMALL_REPLAY, timeout=600)
    checks = checks_of(r.stdout)
    assert checks["cuda"]["status"] == "pass" and checks["gpu"]["status"] == "pass"
    assert checks["replay"]["data"]["device"].startswith("cuda")
    updates = {name: c for name, c in checks.items() if name.startswith("update/")}
    assert {"update/eager", "update/channels_last", "update/amp-fp16", "update/graph"} <= set(
        updates
    )
    for name, c in updates.items():
        assert c["status"] == "pass", (name, c["found"])
    assert checks["onnx export"]["status"] == "pass"
    assert checks["onnx on the gpu"]["status"] in ("pass", "skip"), checks["onnx on the gpu"]
    if importlib.util.find_spec("tensorrt") is not None:
        assert checks["tensorrt engine"]["status"] == "pass", checks["tensorrt engine"]["found"]
    assert r.returncode == 0, r.stdout


def test_updates_that_disagree_with_their_reference_fail():
    """The comparisons behind "graph and eager updates must agree", on the CPU: a mode's first
    loss must match its reference's; a graph-checked mode every loss and the weights too."""
    from edgerl.config import Config
    from edgerl.doctor.core import Context
    from edgerl.doctor.deep import check_replay
    from edgerl.doctor.modes import GRAPH_RTOL

    ctx = Context(Config(), device=torch.device("cpu"), torch_ok=True)
    state = DeepState(torch.device("cpu"))
    assert check_replay(ctx, state).status == "pass"
    eager, channels_last = update_modes(state.device)
    assert check_update(ctx, state, eager).status == "pass"
    reference = state.outcomes["eager"]
    reference.losses = [v * 1.5 for v in reference.losses]
    check = check_update(ctx, state, channels_last)
    assert check.status == "fail" and "first loss matches eager" in check.found

    # A stand-in for the graph mode: the channels_last update, checked as a graph is, against a
    # reference that is exactly the channels_last update, then against altered ones.
    graph_like = Mode("graph-like", "off", "off", True, "eager", GRAPH_RTOL, graph=True)
    same = state.outcomes["channels_last"]
    reference.losses, reference.weights = list(same.losses), list(same.weights)
    assert check_update(ctx, state, graph_like).status == "pass"
    reference.losses = [*same.losses[:-1], same.losses[-1] * 3]
    check = check_update(ctx, state, graph_like)
    assert check.status == "fail" and "losses match eager" in check.found
    assert check_update(ctx, state, channels_last).status == "pass"  # later losses: not compared
    reference.losses = list(same.losses)
    reference.weights = [w + 1.0 for w in same.weights]
    check = check_update(ctx, state, graph_like)
    assert check.status == "fail" and "weights to" in check.found


def test_the_onnx_gpu_comparison_with_the_cpu_provider_standing_in(monkeypatch, tmp_path):
    """The deep ONNX checks run here as on a GPU, the CPU provider standing where ONNX Runtime's
    GPU providers would (none exists here): export, open as `edgerl play --model` does, agree."""
    from edgerl.config import Config
    from edgerl.doctor import software
    from edgerl.doctor.core import Context
    from edgerl.doctor.deep import check_onnx_export, check_onnx_gpu, check_replay

    ctx = Context(Config(), device=torch.device("cpu"), torch_ok=True)
    state = DeepState(torch.device("cpu"), workdir=tmp_path)
    assert check_onnx_gpu(ctx, state).status == "skip"  # no GPU
    assert check_replay(ctx, state).status == "pass"
    assert check_update(ctx, state, update_modes(state.device)[0]).status == "pass"
    assert check_onnx_export(ctx, state).status == "pass"
    monkeypatch.setattr(software, "GPU_PROVIDERS", ("CPUExecutionProvider",))
    state.device = torch.device("cuda")  # only its type is read before the comparison
    check = check_onnx_gpu(ctx, state)
    assert check.status == "pass", check.found
    assert check.data["provider"] == "CPUExecutionProvider" and check.data["agreement"]["ok"]


@pytest.mark.parametrize(
    ("capability", "archs", "native"),
    [
        ((8, 7), ["sm_72", "sm_87"], "sm_87"),  # JetPack 6 wheel on an Orin
        ((8, 6), ["sm_75", "sm_80", "sm_90"], "sm_80"),  # same major, older minor: runs
        ((9, 0), ["sm_80", "sm_86", "compute_86"], None),  # only PTX would get there
        ((11, 0), ["sm_100", "sm_110"], "sm_110"),
    ],
)
def test_which_torch_kernels_run_on_a_gpu(capability, archs, native):
    from edgerl.doctor.software import compatible_arch

    assert compatible_arch(capability, archs) == native


def test_missing_optional_packages_are_lines_with_the_install_command(cli, monkeypatch):
    import sys

    for name in ("onnxruntime", "pygame", "tensorrt"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    r = cli("doctor", "--json", *SMALL_REPLAY)
    assert r.code == 0, r.out
    checks = checks_of(r.out)
    assert checks["onnxruntime"]["status"] == "warn"
    assert checks["onnxruntime"]["fix"] == "pip install 'edgerl[export]'"
    assert checks["display"]["status"] == "warn"
    assert checks["display"]["fix"] == "pip install 'edgerl[viewer]'"
    assert checks["tensorrt"]["status"] in ("skip", "warn")


@pytest.mark.parametrize(
    ("capability", "said", "not_said"),
    [
        ((9, 0), "fp32 with TF32 convolutions (compute 9.0", "fp16"),
        ((7, 5), "fp32 (compute 7.5; on a discrete GPU auto keeps fp32", "TF32"),
    ],
)
def test_the_precision_line_on_a_discrete_gpu_says_what_auto_runs(
    monkeypatch, capability, said, not_said
):
    """What perf.amp=auto runs on a desktop GPU, and what to set for mixed precision there (a
    GPU before Ampere has no TF32 and no bf16). Drawn here without a GPU: the capability is
    the stand-in."""
    from edgerl.config import Config
    from edgerl.doctor.core import Context
    from edgerl.doctor.software import check_precision

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    check = check_precision(Context(Config(), device=torch.device("cuda", 0), torch_ok=True))
    assert check.status == "pass" and said in check.found and not_said not in check.found
    assert check.data["amp"] is None and check.data["cuda_graphs"] is True


def test_a_check_whose_message_spans_lines_is_one_line_of_the_table():
    from edgerl.doctor.core import Check

    # jetson-stats' message when its service is down, as an emulated Orin printed it
    said = "The jtop.service is not active. Please run:\nsudo jtop --install-service"
    line = Check("jtop", "warn", f"the jtop service does not answer ({said})", "a\nfix").line()
    assert "\n" not in line and "Please run: sudo jtop --install-service)  fix: a fix" in line


def test_deep_with_ppo_fills_the_rollout_it_says():
    """PPO's rollout is sized by its own key: the check's 16 steps x 4, as its sentence says
    (it filled 128 x 4 while saying 16 x 4 when the check set PQN's key only)."""
    from edgerl.config import Config, with_values
    from edgerl.doctor.core import Context
    from edgerl.doctor.deep import ROLLOUT_ENVS, ROLLOUT_STEPS, check_rollout

    cfg = with_values(Config(), {"agent.algo": "ppo"})
    ctx = Context(cfg, device=torch.device("cpu"), torch_ok=True)
    state = DeepState(torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        state.workdir = Path(tmp)
        rollout = check_rollout(ctx, state)
    assert rollout.status == "pass", rollout.found
    assert f"{ROLLOUT_STEPS} steps x {ROLLOUT_ENVS} real" in rollout.found
    learner = state.outcomes["rollout"].learner
    assert learner.steps_per_unit == ROLLOUT_STEPS * ROLLOUT_ENVS


def test_deep_with_sac_learns_the_configured_continuous_game_and_exports_it(cli):
    """SAC cannot learn Pong: the deep checks fill the replay from the configured Pendulum-v1
    and check that SAC learns from it (DQN's update modes are DQN's), then export its actions
    (it used to build DQN's update on Pong and fail with SAC's refusal)."""
    r = cli("doctor", "--deep", "--json", "--set", "env.id=Pendulum-v1", "--set", "agent.algo=sac")
    checks = {c["name"]: c for c in json.loads(r.out)["checks"]}
    assert checks["game"]["found"].endswith(
        "actions of 1 number within bounds, observations 3 float32"
    )
    assert checks["replay"]["status"] == "pass" and "Pendulum-v1 steps" in checks["replay"]["found"]
    assert checks["update/eager"]["status"] == "pass", checks["update/eager"]
    assert "units of learning" in checks["update/eager"]["found"]
    assert "update/channels_last" not in checks
    assert checks["onnx export"]["status"] == "pass", checks["onnx export"]
    assert "max |d actions|" in checks["onnx export"]["found"]


def test_deep_with_ppo_on_a_continuous_game_checks_its_gaussian_head(cli):
    """PPO can learn Pong, but a Pendulum-v1 user trains its Gaussian head: the deep checks
    learn a rollout of the configured game and export its actions (they checked PPO's
    categorical head on Pong)."""
    r = cli("doctor", "--deep", "--json", "--set", "env.id=Pendulum-v1", "--set", "agent.algo=ppo")
    checks = {c["name"]: c for c in json.loads(r.out)["checks"]}
    assert checks["rollout"]["status"] == "pass", checks["rollout"]
    assert "real Pendulum-v1 environments" in checks["rollout"]["found"]
    assert checks["onnx export"]["status"] == "pass", checks["onnx export"]
    assert "Pendulum-v1 observations: max |d actions|" in checks["onnx export"]["found"]
