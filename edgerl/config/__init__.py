"""Typed configuration: one dataclass per section, TOML layers, ``--set`` overrides, presets.

Layers, each overriding the one before:

1. built-in defaults (the fields below),
2. ``/etc/edgerl/edgerl.toml`` if present (the service's file; ``EDGERL_SYSTEM_CONFIG`` moves it,
   an empty value disables it),
3. ``--config FILE``,
4. ``--set section.key=value`` (repeatable; the value is read as TOML, else as a plain string),
5. the shortcut flags ``--env``, ``--steps``, ``--run-dir``.

Keys nobody set follow the observation kind of the environment and the learner (see
:mod:`edgerl.config.presets`): Atari-scale values for frames, small-task values for vector
observations. The resolved config is written to the run directory, so a run can always be
reproduced. Text is read and each value checked by
:mod:`edgerl.config.parse`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from edgerl.config.fleet import FleetConfig
from edgerl.config.parse import (
    check_range,
    coerce,
    flatten,
    parse_override,
    parse_toml_file,
    unknown_key,
)
from edgerl.config.sections import (
    AgentConfig,
    DisplayConfig,
    EnvConfig,
    EvalConfig,
    GAConfig,
    HwConfig,
    LogConfig,
    PerfConfig,
    PPOConfig,
    PQNConfig,
    ReplayConfig,
    SACConfig,
    TrainConfig,
)

SYSTEM_CONFIG = Path("/etc/edgerl/edgerl.toml")


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    pqn: PQNConfig = field(default_factory=PQNConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    ga: GAConfig = field(default_factory=GAConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    display: DisplayConfig = field(default_factory=DisplayConfig)
    hw: HwConfig = field(default_factory=HwConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    # Keys set by a layer above the built-in defaults; presets never touch these.
    explicit: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def get(self, key: str) -> Any:
        section, name = key.split(".", 1)
        return getattr(getattr(self, section), name)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The config as plain TOML-ready values (tuples become lists)."""
        out: dict[str, dict[str, Any]] = {}
        for section in SECTIONS:
            values = dataclasses.asdict(getattr(self, section))
            out[section] = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        return out

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())


SECTIONS: dict[str, type] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(Config)
    if f.name != "explicit"
}


def keys() -> list[str]:
    """Every config key as ``section.name``."""
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def field_info(key: str) -> tuple[dataclasses.Field[Any], Any]:
    """The dataclass field and its resolved type for ``section.name``; raises KeyError."""
    section, _, name = key.partition(".")
    cls = SECTIONS[section]
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f, get_type_hints(cls)[name]
    raise KeyError(key)


# Names other DQN code bases (Stable-Baselines3, CleanRL) use for our keys: a user's first guess.
KNOWN_ALIASES = {
    "learning_rate": "agent.lr",
    "buffer_size": "replay.capacity",
    "total_timesteps": "train.steps",
    "target_update_interval": "agent.target_update",
    "target_network_frequency": "agent.target_update",
    "exploration_final_eps": "agent.eps_end",
    "exploration_initial_eps": "agent.eps_start",
    "end_e": "agent.eps_end",
    "start_e": "agent.eps_start",
    "num_envs": "env.num_envs",
    "seed": "env.seed",
}


@dataclass(frozen=True)
class Layer:
    """One source of settings: where they came from and the flat ``section.key -> value`` map."""

    source: str
    values: Mapping[str, Any]


def system_config_path() -> Path | None:
    """The service's config file, moved by ``EDGERL_SYSTEM_CONFIG`` (empty: none)."""
    env = os.environ.get("EDGERL_SYSTEM_CONFIG")
    if env is not None:
        return Path(env) if env else None
    return SYSTEM_CONFIG


def build_layers(
    config_file: str | Path | None = None,
    overrides: Iterable[str] = (),
    shortcuts: Mapping[str, Any] | None = None,
    use_system: bool = True,
) -> list[Layer]:
    """The layers above the built-in defaults, in order, from files and command-line options."""
    layers: list[Layer] = []
    system = system_config_path() if use_system else None
    if system is not None and system.exists():  # not a plain file there: said, not skipped
        layers.append(Layer(str(system), flatten(parse_toml_file(system), str(system), SECTIONS)))
    if config_file is not None:
        path = Path(config_file)
        named = flatten(parse_toml_file(path, named=True), str(path), SECTIONS)
        layers.append(Layer(str(path), named))
    sets = dict(parse_override(o, keys(), KNOWN_ALIASES) for o in overrides)
    if sets:
        layers.append(Layer("--set", sets))
    flags = {k: v for k, v in (shortcuts or {}).items() if v is not None}
    if flags:
        layers.append(Layer("command line", flags))
    return layers


def resolve(layers: Iterable[Layer]) -> Config:
    """Apply layers over the defaults, checking every key, type and range; raises ConfigError."""
    cfg = Config()
    explicit: set[str] = set()
    for layer in layers:
        for key, value in layer.values.items():
            try:
                fld, typ = field_info(key)
            except KeyError:
                raise unknown_key(key, layer.source, keys(), KNOWN_ALIASES) from None
            coerced = coerce(key, value, typ, layer.source)
            check_range(key, coerced, fld.metadata, layer.source)
            section, name = key.split(".", 1)
            setattr(getattr(cfg, section), name, coerced)
            explicit.add(key)
    cfg.explicit = frozenset(explicit)
    return cfg


def from_dict(table: Mapping[str, Any], source: str) -> Config:
    """A config from a nested dict (a resolved config file or a checkpoint's copy)."""
    return resolve([Layer(source, flatten(table, source, SECTIONS))])


def with_values(cfg: Config, values: Mapping[str, Any]) -> Config:
    """A new config: ``cfg`` with ``section.key -> value`` replaced (``cfg`` is not changed).

    Values are taken as they are (callers pass resolved, typed values); which keys count as
    explicitly set does not change.
    """
    sections: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, name = key.split(".", 1)
        sections.setdefault(section, {})[name] = value
    return dataclasses.replace(
        cfg,
        **{s: dataclasses.replace(getattr(cfg, s), **sections.get(s, {})) for s in SECTIONS},
    )
