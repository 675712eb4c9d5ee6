"""The recipe a machine trains by default (edgerl/hw/recipe.py): by its class, on the emulated
boards of every generation (tests/fixtures/boards), and what the service and the commands say
of it."""

from __future__ import annotations

import pytest

from edgerl.config.presets import NAMED_PRESETS, named_preset_layer
from edgerl.hw.platform import Platform, detect
from edgerl.hw.recipe import board_recipe
from edgerl.report.status import Liveness, describe
from edgerl.service.daemon import daemon_config

from .conftest import FIXTURES

DOCS = FIXTURES.parents[1] / "docs"

BOARDS = FIXTURES / "boards"


@pytest.mark.parametrize(
    ("board", "memory", "envs"),
    [("nano_jp4", 4, 64), ("agx_orin_jp6", 64, 128), ("thor_jp7", 128, 128)],
)
def test_a_jetson_trains_pqn_on_its_gpu_with_environments_by_its_memory(board, memory, envs):
    platform = detect(BOARDS / board)
    assert platform.is_jetson and platform.memory_gb == pytest.approx(memory)
    recipe = board_recipe(platform, cuda=True, integrated=True)
    assert recipe.preset == "pong-jetson" and recipe.values["agent.algo"] == "pqn"
    assert f"sharing {memory} GiB" in recipe.why and f"{envs} environments" in recipe.why
    assert recipe.values.get("env.num_envs", 128) == envs  # 128: PQN's own preset
    assert "estimated" in recipe.why  # no Jetson run is on record: it says so
    # A Jetson whose GPU PyTorch cannot use (a CPU-only wheel) trains on its cores instead.
    cpu = board_recipe(platform, cuda=False, integrated=False)
    assert cpu.preset == "pong-cpu" and "a Jetson whose GPU PyTorch cannot use" in cpu.why
    assert f"on {platform.cpu_count} CPU cores" in cpu.why


def test_a_desktop_gpu_and_a_cpu_only_machine_train_their_records_recipes():
    desktop = Platform(False, None, None, 16, "NVIDIA H100 80GB HBM3", 125.0)
    assert board_recipe(desktop, cuda=True, integrated=False).preset == "pong-gpu"
    assert board_recipe(desktop, cuda=False, integrated=False).preset == "pong-cpu"
    assert not NAMED_PRESETS["pong-cpu"].gpu and NAMED_PRESETS["pong-jetson"].gpu


def test_the_service_trains_the_machines_recipe_when_its_config_chooses_no_learner(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("EDGERL_HW_ROOT", str(BOARDS / "nano_jp4"))  # a Nano without its GPU
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # as here, on a GPU too
    monkeypatch.setenv("CACHE_DIRECTORY", str(tmp_path / "cache"))
    silent = tmp_path / "silent.toml"
    silent.write_text(  # the class's recipe unmeasured (the calibration: the tests below)
        f'[env]\nid = "ALE/Breakout-v5"\n[train]\nsteps = 5000\nrun_dir = "{tmp_path / "new"}"\n'
        "[hw]\ncalibrate = false\n"
    )
    cfg = daemon_config(silent)
    assert cfg.agent.algo == "pqn" and cfg.env.repeat_action_probability == 0.0
    assert cfg.env.id == "ALE/Breakout-v5" and cfg.train.steps == 5000  # the file wins
    assert cfg.train.recipe.startswith("pong-cpu (a Jetson whose GPU PyTorch cannot use")
    chosen = tmp_path / "chosen.toml"
    chosen.write_text('[agent]\nalgo = "dqn"\n')
    own = daemon_config(chosen)
    assert own.agent.algo == "dqn" and own.train.recipe == ""  # a learner chosen: no recipe
    assert own.env.repeat_action_probability == 0.25
    # A service set up before recipes goes on with its run as it was configured: a run there
    # trained without a recipe keeps the defaults' learner (its checkpoint's).
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.toml").write_text('[agent]\nalgo = "dqn"\n[train]\nrecipe = ""\n')
    silent.write_text(f'[train]\nrun_dir = "{old}"\n[hw]\ncalibrate = false\n')
    assert daemon_config(silent).agent.algo == "dqn" and daemon_config(silent).train.recipe == ""
    # One trained with the recipe keeps it.
    (old / "config.toml").write_text('[train]\nrecipe = "pong-cpu (no CUDA GPU)"\n')
    assert daemon_config(silent).agent.algo == "pqn"


def test_preset_board_names_the_recipe_and_status_shows_it():
    from edgerl.run.calibrate import calibrated_layer

    layer = calibrated_layer(calibrated=False)  # the class's own (the calibration's own tests)
    assert layer.values["agent.algo"] == "pqn"
    assert layer.values["train.recipe"] == board_recipe().describe()
    named = named_preset_layer("pong-cpu")
    assert named.values["train.recipe"] == "pong-cpu (--preset pong-cpu)"
    doc = {"env": "ALE/Pong-v5", "recipe": layer.values["train.recipe"], "step": 0}
    shown = describe(doc, Liveness(True, False, 1.0, "running"))
    assert f"recipe: {board_recipe().describe()}" in shown.splitlines()


def test_the_continuous_recipe_trains_as_its_runs_on_record_did():
    """``--preset halfcheetah-cpu`` resolves (SAC's presets for a continuous game of vectors
    under it) to the settings each HalfCheetah SAC seed on record kept in its config.toml, but
    the run directory, the seed and the torch threads the seeds were given."""
    import tomllib

    from edgerl.config import resolve

    preset = NAMED_PRESETS["halfcheetah-cpu"]
    assert preset.obs_kind == "vector" and preset.continuous and not preset.gpu
    cfg = preset.config(resolve([named_preset_layer("halfcheetah-cpu")]))
    assert cfg.env.id == "HalfCheetah-v5" and cfg.agent.algo == "sac"
    runs = sorted((DOCS / "runs" / "halfcheetah-sac-seeds").glob("seed-*/config.toml"))
    assert len(runs) >= 3
    # what a run or its machine decides: its directory, its seed, its threads and their places
    own = {"env.seed", "env.threads", "env.pin_threads", "env.batch_size", "train.run_dir"}
    own |= {"train.recipe", "replay.device"}
    for path in runs:
        saved = tomllib.loads(path.read_text())
        for section in ("env", "agent", "replay", "sac", "train", "eval"):
            mine = vars(getattr(cfg, section))
            for key, value in saved[section].items():
                if f"{section}.{key}" in own or key not in mine:
                    continue
                want = list(mine[key]) if isinstance(mine[key], tuple) else mine[key]
                assert value == want, f"{path.parent.name}: {section}.{key}"
