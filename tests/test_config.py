"""Config layering, presets and every config error a user can make."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgerl.config import Config, build_layers, field_info, from_dict, keys, resolve
from edgerl.config.parse import parse_override, tomllib
from edgerl.config.presets import PRESETS, apply_presets
from edgerl.errors import ConfigError
from edgerl.learners.factory import check_keys

REPO = Path(__file__).resolve().parents[1]


def load(*overrides: str, config_file: Path | None = None, **shortcuts):
    return resolve(build_layers(config_file, overrides, shortcuts))


def test_defaults_train_pong():
    cfg = Config()
    assert cfg.env.id == "ALE/Pong-v5"
    assert cfg.agent.double is True
    assert cfg.perf.device == "auto"
    assert cfg.display.every == 3


def test_layers_override_in_order(tmp_path, monkeypatch):
    system = tmp_path / "system.toml"
    system.write_text("[agent]\nlr = 1e-3\ngamma = 0.9\n[train]\nsteps = 5\n")
    user = tmp_path / "user.toml"
    user.write_text("[agent]\ngamma = 0.95\nbatch_size = 64\n")
    monkeypatch.setenv("EDGERL_SYSTEM_CONFIG", str(system))
    cfg = load(
        "agent.batch_size=128",
        "train.steps=7",
        config_file=user,
        **{"train.steps": 9, "env.id": "CartPole-v1"},
    )
    assert cfg.agent.lr == 1e-3  # system file
    assert cfg.agent.gamma == 0.95  # --config over system
    assert cfg.agent.batch_size == 128  # --set over --config
    assert cfg.train.steps == 9  # shortcut flag over --set
    assert cfg.env.id == "CartPole-v1"
    assert {"agent.lr", "agent.gamma", "agent.batch_size", "train.steps", "env.id"} <= cfg.explicit
    assert "agent.eps_end" not in cfg.explicit


def test_system_config_absent_or_disabled(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGERL_SYSTEM_CONFIG", str(tmp_path / "missing.toml"))
    assert load().agent.lr == Config().agent.lr


def test_set_values_are_toml_or_plain_strings():
    assert parse_override("env.id=ALE/Breakout-v5") == ("env.id", "ALE/Breakout-v5")
    assert parse_override("display.enabled=false") == ("display.enabled", False)
    assert parse_override("agent.hidden=[64, 64]") == ("agent.hidden", [64, 64])
    assert parse_override('env.id="CartPole-v1"') == ("env.id", "CartPole-v1")
    cfg = load("train.steps=1e6", "agent.lr=3e-4", "agent.hidden=[32]", "display.enabled=off")
    assert cfg.train.steps == 1_000_000 and isinstance(cfg.train.steps, int)
    assert cfg.agent.lr == 3e-4 and cfg.agent.hidden == (32,) and cfg.display.enabled is False


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.lrr=1", "--set: unknown config key 'agent.lrr' (did you mean 'agent.lr'?)"),
        ("agnt.lr=1", "unknown config key 'agnt.lr' (did you mean 'agent.lr'?)"),
        # another code base's name, mistyped: its meaning, not the nearest spelling of ours
        ("agent.lerning_rate=1", "key 'agent.lerning_rate' (did you mean 'agent.lr'?)"),
        ("agent.learning_start=1", "'agent.learning_start' (did you mean 'agent.learning_starts'"),
        ("agent.gamma=1.5", "agent.gamma must be between 0.0 and 1.0, got 1.5"),
        ("agent.batch_size=0", "agent.batch_size must be between 1 and 65,536, got 0"),
        ("agent.batch_size=3.5", "agent.batch_size must be an integer, got 3.5"),
        ("agent.double=maybe", "agent.double must be true or false, got 'maybe'"),
        ("perf.device=tpu", "perf.device must be one of auto, cpu, cuda, got 'tpu'"),
        ("agent.hidden=64", "agent.hidden must be a list of integers"),
        ("nodot=1", "must look like section.key=value, e.g. agent.lr=3e-4"),
        (
            "total_timesteps=1000",
            "must look like section.key=value: did you mean train.steps=1000?",
        ),
        ("num_envs=8", "did you mean env.num_envs=8?"),
        ("learning_starts=5", "did you mean agent.learning_starts=5?"),
        ("agent.lr=nan", "agent.lr must be a finite number, got nan"),
        ("env.seed=99999999999999999999", "env.seed must be between 0 and 2,147,483,647"),
        ("agent.lr=1" + "0" * 400, "agent.lr must be a finite number, got 100000000000..."),
    ],
)
def test_bad_settings_name_the_key_and_the_allowed_values(override, message):
    with pytest.raises(ConfigError) as e:
        load(override)
    assert message in str(e.value)


def test_unknown_section_in_a_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[agnet]\nlr = 1\n")
    with pytest.raises(
        ConfigError, match=r"c.toml: unknown config section \[agnet\] \(did you mean \[agent\]"
    ):
        load(config_file=f)


def test_toml_syntax_error_names_the_file_and_line(tmp_path):
    f = tmp_path / "broken.toml"
    f.write_text("[agent]\nlr = 1e-4\ngamma = = 0.9\n")
    with pytest.raises(ConfigError) as e:
        load(config_file=f)
    assert str(f) in str(e.value) and "line 3" in str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(config_file=tmp_path / "nope.toml")


def test_presets_fill_only_keys_nobody_set():
    cfg = load("agent.lr=0.5")
    vec = apply_presets(cfg, "vector")
    assert vec.agent.lr == 0.5  # explicit wins
    assert vec.agent.batch_size == PRESETS["vector"]["agent.batch_size"]
    assert vec.env.num_envs == PRESETS["vector"]["env.num_envs"]
    assert cfg.agent.batch_size == Config().agent.batch_size  # the input is not modified
    assert apply_presets(cfg, "frames").agent.batch_size == 32


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("agent.eps_start=0.1", "agent.eps_end=0.5"), "agent.eps_end (0.5) must not exceed"),
        (("agent.batch_size=512", "replay.capacity=256"), "must not exceed replay.capacity"),
        (("env.num_envs=8", "replay.capacity=64"), "raise replay.capacity to 128 or more"),
        (
            ("env.num_envs=100000",),
            "lower env.num_envs to 12,500 or less, or raise replay.capacity to 1,600,000",
        ),
        (("agent.algo=ga", "agent.eps_start=0.1", "agent.eps_end=0.5"), "must not exceed agent"),
        (("agent.hidden=[0]",), "agent.hidden must list 1 to 16 layer widths"),
        (("agent.hidden=[100000000]",), "between 1 and 65,536, got [100000000]"),
        (("display.env_index=4",), "display.env_index (4) must be below env.num_envs (4)"),
    ],
)
def test_inconsistent_settings(overrides, message):
    with pytest.raises(ConfigError) as e:
        check_keys(load(*overrides))
    assert message in str(e.value)


@pytest.mark.parametrize("algo", ["pqn", "ga"])
def test_a_replays_rules_are_not_asked_of_a_learner_without_one(algo):
    """replay.capacity is the replay's: 300,000 environments of PQN (a rollout) or of the GA
    (episode scores) are not refused for it; the memory's plan weighs their size instead."""
    check_keys(load(f"agent.algo={algo}", "env.num_envs=300000", "replay.capacity=16"))
    with pytest.raises(ConfigError, match=r"lower env\.num_envs to 12,500 or less"):
        check_keys(load("agent.algo=dqn", "env.num_envs=300000"))


def test_round_trip_through_toml():
    import tomllib

    cfg = load("agent.hidden=[32, 16]", "env.id=CartPole-v1")
    again = from_dict(tomllib.loads(cfg.to_toml()), "x")
    assert again == cfg


def test_cli_config_errors_are_one_sentence_without_traceback(cli, tmp_path):
    r = cli("config", "--set", "agent.lrr=1")
    assert r.code == 2
    assert r.err.strip() == (
        "edgerl: error: --set: unknown config key 'agent.lrr' (did you mean 'agent.lr'?)"
    )
    assert "Traceback" not in r.err
    r = cli("--debug", "config", "--set", "agent.lrr=1")
    assert r.code == 2 and "Traceback" in r.err
    r = cli("config", "--markdown")  # was ignored: the TOML came out
    assert r.code == 2 and r.out == "" and "give it with --reference" in r.err


def test_cli_config_shows_presets_for_the_environment(cli):
    r = cli("config", "--env", "CartPole-v1")
    assert r.code == 0
    assert f"batch_size = {PRESETS['vector']['agent.batch_size']}" in r.out
    assert 'id = "CartPole-v1"' in r.out


def test_a_gpu_preset_is_shown_anywhere_and_refused_for_training_without_a_gpu(cli, tmp_path):
    """`edgerl config --preset pong-gpu` shows the recipe on a laptop; training it there says
    which preset is for a CPU before anything is written (not perf.amp's error about bf16)."""
    import torch

    r = cli("config", "--preset", "pong-gpu")
    assert r.code == 0, r.err
    shown = tomllib.loads(r.out)
    assert shown["perf"]["amp"] == "bf16" and shown["eval"]["every_steps"] == 500_000
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the preset would train")
    run = tmp_path / "run"
    r = cli("train", "--preset", "pong-gpu", "--run-dir", run)
    assert r.code == 2 and "Traceback" not in r.err
    assert "--preset pong-gpu is a recipe for a CUDA GPU" in r.err and "--preset pong-cpu" in r.err
    assert not run.exists()


def test_a_preset_for_any_atari_game_wants_the_game(cli, tmp_path):
    """`--preset atari-cpu` alone named no game: it trained Pong (resuming a pong-cpu run there
    under its own name). The game comes from --env, or from the run directory's run."""
    r = cli("train", "--preset", "atari-cpu")
    assert r.code == 2 and "Traceback" not in r.err
    assert "--preset atari-cpu is a recipe for any Atari game and names none" in r.err
    assert "--env ALE/Breakout-v5" in r.err and "pong-cpu" in r.err
    assert not (tmp_path / "runs").exists()
    r = cli("config", "--preset", "atari-cpu", "--env", "ALE/Breakout-v5")
    assert r.code == 0 and tomllib.loads(r.out)["env"]["id"] == "ALE/Breakout-v5", r.err
    run = tmp_path / "breakout"
    run.mkdir()
    saved = REPO / "docs" / "runs" / "breakout-cpu-2core-pqn" / "config.toml"
    (run / "config.toml").write_bytes(saved.read_bytes())
    r = cli("config", "--preset", "atari-cpu", "--run-dir", run)
    assert r.code == 0 and tomllib.loads(r.out)["env"]["id"] == "ALE/Breakout-v5", r.err


def test_a_key_of_another_learner_is_refused_on_the_command_line(cli, tmp_path):
    """`--set ppo.clip=0.1` on a DQN run changed nothing, silently: it is refused in one
    sentence before anything is written; the learner that reads it takes it, and a config file
    (often shared by several learners' runs) only has it said."""
    run = tmp_path / "run"
    r = cli("train", "--env", "CartPole-v1", "--set", "ppo.clip=0.1", "--run-dir", run)
    assert r.code == 2 and "Traceback" not in r.err and not run.exists()
    assert "--set ppo.clip does nothing with agent.algo=dqn: [ppo] holds the keys of" in r.err
    assert "add --set agent.algo=ppo to train that learner" in r.err
    r = cli("config", "--env", "CartPole-v1", "--set", "agent.algo=ppo", "--set", "ppo.clip=0.1")
    assert r.code == 0 and tomllib.loads(r.out)["ppo"]["clip"] == 0.1, r.err
    r = cli("config", "--preset", "pong-cpu", "--set", "ga.sigma=0.01")
    assert r.code == 2 and "--set ga.sigma does nothing with agent.algo=pqn" in r.err, r.err
    shared = tmp_path / "shared.toml"
    shared.write_text("[ppo]\nclip = 0.1\n[pqn]\nepochs = 1\n")
    r = cli("config", "--env", "CartPole-v1", "--config", shared, "--set", "agent.algo=pqn")
    assert r.code == 0, r.err
    assert "sets ppo.clip, which agent.algo=pqn does not read: it does nothing" in r.err


def test_a_key_of_a_memory_the_learner_lacks_is_refused_on_the_command_line(cli, tmp_path):
    """`--set replay.capacity=1000` on a learner without a replay (PQN, PPO, the GA), and `--set
    pqn.rollout_steps=8` on one without a rollout (DQN, SAC: every learner was counted a reader
    of PQN's rollout key), changed nothing, silently: they are refused as another learner's keys
    are, the learners that read them take them, and a config file's are said in the log."""
    run = tmp_path / "run"
    pqn = ["--env", "CartPole-v1", "--set", "agent.algo=pqn"]
    r = cli("train", *pqn, "--set", "replay.capacity=1000", "--steps", "100", "--run-dir", run)
    assert r.code == 2 and "Traceback" not in r.err and not run.exists()
    said = "--set replay.capacity does nothing with agent.algo=pqn, which learns without a replay"
    assert said in r.err and "[replay] holds the keys of the replay of agent.algo=dqn" in r.err
    for algo in ("ppo", "ga"):
        sets = ["--set", f"agent.algo={algo}", "--set", "replay.persist=false"]
        r = cli("config", "--env", "CartPole-v1", *sets)
        assert r.code == 2 and f"--set replay.persist does nothing with agent.algo={algo}" in r.err
    for game, algo in (("CartPole-v1", "dqn"), ("Pendulum-v1", "sac")):
        r = cli("config", "--env", game, "--set", "pqn.rollout_steps=8")
        assert r.code == 2 and "Traceback" not in r.err, r.err
        assert f"--set pqn.rollout_steps does nothing with agent.algo={algo}: [pqn]" in r.err
        r = cli("config", "--env", game, "--set", "replay.capacity=100000")
        assert r.code == 0 and tomllib.loads(r.out)["replay"]["capacity"] == 100_000, r.err
    r = cli("config", *pqn, "--set", "pqn.rollout_steps=8")
    assert r.code == 0 and tomllib.loads(r.out)["pqn"]["rollout_steps"] == 8, r.err
    shared = tmp_path / "shared.toml"
    shared.write_text("[replay]\ncapacity = 1000\n")
    r = cli("config", *pqn, "--config", shared)
    assert r.code == 0, r.err
    assert "sets replay.capacity, which agent.algo=pqn does not read: it does nothing" in r.err


def test_epsilon_keys_are_refused_for_a_learner_that_does_not_explore_by_epsilon(cli, tmp_path):
    """`--set agent.eps_start=0.5` on a PPO run changed nothing, silently (PPO samples its
    actions, SAC adds its policy's noise, the GA plays members greedily): refused in one
    sentence naming the learners that read it; DQN and PQN take it."""
    run = tmp_path / "run"
    for game, algo in (("CartPole-v1", "ppo"), ("CartPole-v1", "ga"), ("Pendulum-v1", "sac")):
        sets = ["--set", f"agent.algo={algo}", "--set", "agent.eps_decay_steps=1000"]
        r = cli("train", "--env", game, *sets, "--steps", "100", "--run-dir", run)
        assert r.code == 2 and "Traceback" not in r.err and not run.exists(), r.err
        assert r.err.strip().count("\n") == 0, r.err
        said = f"--set agent.eps_decay_steps does nothing with agent.algo={algo}, which explores"
        assert said in r.err and "read by agent.algo=dqn and agent.algo=pqn" in r.err, r.err
    # a continuous game naming no learner trains SAC: refused for it too
    r = cli("config", "--env", "Pendulum-v1", "--set", "agent.eps_end=0.1")
    assert r.code == 2 and "with agent.algo=sac" in r.err, r.err
    for algo in ("dqn", "pqn"):
        r = cli(
            "config",
            "--env",
            "CartPole-v1",
            "--set",
            f"agent.algo={algo}",
            "--set",
            "agent.eps_end=0.1",
        )
        assert r.code == 0 and tomllib.loads(r.out)["agent"]["eps_end"] == 0.1, r.err
    r = cli("doctor", "--json", "--set", "agent.algo=ppo", "--set", "agent.eps_start=0.5")
    assert r.code == 1 and "agent.eps_start does nothing with agent.algo=ppo" in r.out


@pytest.mark.parametrize(
    ("given", "steps"),
    [("1e6", 1_000_000), ("10M", 10_000_000), ("250k", 250_000), ("1_000", 1000)],
)
def test_steps_as_people_write_them(cli, given, steps):
    r = cli("config", "--steps", given)
    assert r.code == 0, r.err
    assert f"steps = {steps}" in r.out.replace("_", "")


@pytest.mark.parametrize("given", ["1.5", "ten", "0"])
def test_steps_that_are_no_count_are_refused(cli, given):
    r = cli("config", "--steps", given)
    assert r.code == 2 and "--steps" in r.err and "Traceback" not in r.err


@pytest.mark.parametrize(
    ("key", "meant"),
    [("agent.learning_rate", "agent.lr"), ("train.total_timesteps", "train.steps")],
)
def test_names_from_other_libraries_suggest_ours(cli, key, meant):
    r = cli("config", "--set", f"{key}=1")
    assert r.code == 2 and f"unknown config key '{key}' (did you mean '{meant}'?)" in r.err


def test_seed_flag_reaches_the_run(cli, tmp_path):
    run = tmp_path / "cp"
    r = cli("train", "--env", "CartPole-v1", "--steps", "200", "--seed", "7", "--run-dir", run)
    assert r.code == 0, r.err
    assert "seed = 7" in (run / "config.toml").read_text()


def test_a_game_typed_in_another_case_names_the_same_run(cli):
    r = cli("config", "--env", "ALE/pong-v5")
    assert r.code == 0, r.err
    assert 'id = "ALE/Pong-v5"' in r.out


@pytest.mark.parametrize("typed", ["Pong", "pong", "Pong-v4x"])
def test_a_bare_game_name_suggests_the_ale_id(cli, typed):
    r = cli("config", "--env", typed)
    assert r.code == 2 and "did you mean 'ALE/Pong-v5'" in r.err, r.err


def test_resuming_a_run_directory_needs_no_env(cli, tmp_path):
    run = tmp_path / "cp"
    r = cli("train", "--env", "CartPole-v1", "--steps", "200", "--run-dir", run)
    assert r.code == 0, r.err
    r = cli("train", "--steps", "400", "--run-dir", run)  # the default game is Pong
    assert r.code == 0, r.err
    assert "step 400/400" in r.err and "CartPole-v1" in (run / "config.toml").read_text()


def test_a_missing_extra_is_named_before_a_run_directory_exists(cli, tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed here")
    run = tmp_path / "tb"
    r = cli("train", "--env", "CartPole-v1", "--run-dir", run, "--set", "train.tensorboard=true")
    assert r.code == 2 and "pip install 'edgerl[tensorboard]'" in r.err
    assert "pip install -e '.[tensorboard]'" in r.err
    assert not run.exists()


NUMERIC = [k for k in keys() if field_info(k)[1] in (int, float)]


def test_every_numeric_key_has_a_finite_range():
    for key in NUMERIC:
        meta = field_info(key)[0].metadata
        assert meta["min"] is not None and meta["max"] is not None, key
        assert math.isfinite(meta["min"]) and math.isfinite(meta["max"]), key


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(NUMERIC),
    value=st.sampled_from(["nan", "inf", "-inf", "1e999", "-1e999", "-1"])
    | st.integers(min_value=10**13, max_value=10**400).map(str)
    | st.integers(min_value=10**13, max_value=10**400).map(lambda v: f"-{v}"),
)
def test_non_finite_huge_and_negative_numbers_are_refused_with_a_sentence(key, value):
    try:
        cfg = load(f"{key}={value}")
    except ConfigError as e:
        assert key in str(e) and "\n" not in str(e) and len(str(e)) < 200, str(e)
    else:  # only -1 can be a value some key takes (eval.every_steps, agent.lr_end)
        assert value == "-1" and cfg.get(key) == -1, key


def test_the_largest_values_a_config_takes_are_ones_training_takes(cli, tmp_path):
    from edgerl.config import EnvConfig
    from edgerl.config.sections import MAX_SEED
    from edgerl.envs import make_env

    def top(key: str) -> int:
        return field_info(key)[0].metadata["max"]

    env = make_env(
        EnvConfig(
            id="ALE/Pong-v5",
            num_envs=1,
            threads=top("env.threads"),
            noop_max=top("env.noop_max"),
            max_episode_frames=top("env.max_episode_frames"),
        )
    )
    try:
        env.reset(seed=MAX_SEED + 123_456)  # env.seed plus the step of a resumed session
    finally:
        env.close()
    run = tmp_path / "cp"
    r = cli(
        *["train", "--env", "CartPole-v1", "--steps", "300", "--run-dir", run],
        *[
            "--set",
            f"env.seed={MAX_SEED}",
            "--set",
            f"hw.monitor_interval_ms={top('hw.monitor_interval_ms')}",
        ],
        *["--set", f"train.checkpoint_every_s={top('train.checkpoint_every_s')}"],
        *["--set", f"agent.grad_clip={top('agent.grad_clip')}", "--set", "agent.gamma=1.0"],
    )
    assert r.code == 0 and "Traceback" not in r.err, r.err[-2000:]


def test_a_config_named_on_the_command_line_may_be_a_pipe(tmp_path, cli):
    import os
    import threading

    fifo = tmp_path / "config-pipe"
    os.mkfifo(fifo)  # what `--config <(generate-config)` hands over

    def write() -> None:
        with open(fifo, "w") as f:
            f.write("[agent]\nlr = 0.0003\n")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    r = cli("config", "--config", fifo)
    writer.join(timeout=30)
    assert r.code == 0 and "lr = 0.0003" in r.out, r.err
    r = cli("config", "--config", "/dev/zero")  # a stream without end is still refused
    assert r.code == 2 and "larger than 1,048,576 bytes" in r.err
