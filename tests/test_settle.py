"""settle.py: a run's config is made final before it is checked, so a value autotune or an
auto setting changes is checked as it will train."""

from __future__ import annotations

import pytest

from edgerl.config import build_layers, resolve, with_values
from edgerl.errors import ConfigError
from edgerl.hw import device
from edgerl.hw.device import learner_threads
from edgerl.run import settle


def requested(tmp_path, *sets: str):
    overrides = ("env.id=CartPole-v1", f"train.run_dir={tmp_path / 'run'}", *sets)
    return resolve(build_layers(None, overrides, {}, use_system=False))


def test_what_autotune_chooses_is_checked_as_it_will_train(tmp_path, monkeypatch):
    """The replay holds 16 steps per environment at the 1 environment asked for, not at the 64
    that the stand-in measurement chooses: refused after autotune, with the keys to change."""

    def chooses_64(cfg, spec, device):
        return with_values(cfg, {"env.num_envs": 64}), None

    monkeypatch.setattr(settle, "autotune_config", chooses_64)
    cfg = requested(tmp_path, "perf.autotune=true", "replay.capacity=200")
    assert settle.settle_config(cfg).cfg.env.num_envs == 1  # before the measurement: as asked
    with pytest.raises(ConfigError, match=r"env\.num_envs=64"):
        settle.settle_config(cfg, autotune=True)


def test_a_precision_the_device_cannot_do_is_refused_before_anything_is_written(tmp_path, cli):
    """--fresh moves an old run aside only once the config is known to train here."""
    run = tmp_path / "run"
    r = cli("train", "--env", "CartPole-v1", "--steps", "300", "--run-dir", run)
    assert r.code == 0, r.err
    before = sorted(p.name for p in run.iterdir())
    r = cli("train", "--env", "CartPole-v1", "--run-dir", run, "--fresh", "--set", "perf.amp=fp16")
    assert r.code == 2 and "perf.amp=fp16 needs a CUDA GPU" in r.err
    assert sorted(p.name for p in run.iterdir()) == before  # not moved aside
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_the_settled_config_has_every_auto_value_set(tmp_path):
    found = settle.settle_config(requested(tmp_path))
    assert found.cfg.train.run_dir == str(tmp_path / "run")
    assert found.cfg.env.batch_size == 0  # auto: lockstep for a vector game on a CPU
    assert found.cfg.agent.lr == 2.3e-3  # CartPole's preset
    assert found.spec.id == "CartPole-v1" and found.autotune is None
    assert found.available > 0
    assert not (tmp_path / "run").exists()  # nothing written while deciding


def test_a_fleet_is_checked_and_its_local_actors_leave_the_learner_the_other_cpus(
    tmp_path, monkeypatch
):
    fleet = ("fleet.actors=2", "env.num_envs=4")
    found = settle.settle_config(requested(tmp_path, *fleet, "replay.capacity=128"))
    assert found.cfg.env.batch_size == 0  # remote actors step their environments together
    monkeypatch.setattr(device, "usable_cpus", lambda: 6)
    assert learner_threads(found.cfg) == 4  # a Ray instance here: 2 actors, 1 CPU each
    assert learner_threads(requested(tmp_path, *fleet, "fleet.cpus_per_actor=4")) == 1
    elsewhere = requested(tmp_path, *fleet, "fleet.address=10.0.0.1:6379")
    assert learner_threads(elsewhere) == 0  # auto: the actors are on other machines
    assert learner_threads(requested(tmp_path, *fleet, "perf.threads=3")) == 3

    for sets, says in [
        (("replay.capacity=100",), r"at least 16 steps per environment of the fleet .* 128"),
        (("agent.algo=pqn",), "fleet.actors needs a learner remote actors can feed"),
        (("env.batch_size=2",), "remote actors step their environments together"),
        (("perf.autotune=true",), "perf.autotune measures actors beside the learner"),
        (("fleet.resource=CPU=2",), "fleet.resource must be NAME or NAME=AMOUNT"),
        (("fleet.resource=a b",), "fleet.resource must be NAME or NAME=AMOUNT"),
    ]:
        with pytest.raises(ConfigError, match=says):
            settle.settle_config(requested(tmp_path, *fleet, *sets))
    from edgerl.config.fleet import parse_resource

    assert parse_resource("board") == {"board": 1.0}
    assert parse_resource("board=2.5") == {"board": 2.5} and parse_resource("") == {}
