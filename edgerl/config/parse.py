"""Reading settings: TOML files, ``--set section.key=value``, each value checked against its field.

These know nothing of edgerl's sections and keys (:mod:`edgerl.config` passes them in): they turn
text into values, coerce a value to a field's type, check its range, and say what a user most
likely meant when a key or section is unknown (another code base's name for it, or a close
spelling).
"""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgerl.errors import ConfigError
from edgerl.files.regular import read_regular

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (JetPack 6)
    import tomli as tomllib


def unknown_key(key: str, source: str, known: list[str], aliases: Mapping[str, str]) -> ConfigError:
    """The error for a key not in ``known``, with the key it most likely meant (``aliases``:
    other code bases' names for known keys)."""
    name = key.rpartition(".")[2]
    alias = aliases.get(name)
    if alias is None and not difflib.get_close_matches(key, known, n=1, cutoff=0.9):
        # no key of ours nearly spelled so: another code base's name, mistyped
        # (agent.lerning_rate means agent.lr, not agent.learning_starts)
        near = difflib.get_close_matches(name, list(aliases), n=1, cutoff=0.85)
        alias = aliases[near[0]] if near else None
    if alias is not None and alias != key:
        return ConfigError(f"{source}: unknown config key '{key}' (did you mean '{alias}'?)")
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ConfigError(f"{source}: unknown config key '{key}'{hint}")


def coerce(key: str, value: Any, typ: Any, source: str) -> Any:
    """Convert a TOML or command-line value to the field's type, or raise ConfigError."""

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{source}: {key} must be {expected}, got {_shown(value)}")

    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "no", "off", "0"):
            return False
        raise bad("true or false")
    if typ is int:
        if isinstance(value, bool):
            raise bad("an integer")
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if isinstance(value, int):
            return value
        raise bad("an integer")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer of hundreds of digits
                raise bad("a finite number") from None
            if not math.isfinite(number):
                raise bad("a finite number")
            return number
        raise bad("a number")
    if typ is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            if "\0" in str(value):  # no path, name or id holds one; the OS refuses them in paths
                raise bad("text without NUL characters")
            return str(value)
        raise bad("a string")
    if typ == dict[str, Any]:  # a TOML table, or its inline text from the command line
        if isinstance(value, str):
            try:
                value = tomllib.loads(f"table = {value.strip() or '{}'}")["table"]
            except tomllib.TOMLDecodeError:
                raise bad("a TOML inline table such as {continuous = false}") from None
        if isinstance(value, Mapping):
            return dict(value)
        raise bad("a TOML inline table such as {continuous = false}")
    if typ == tuple[int, ...]:
        if isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return tuple(value)
        raise bad("a list of integers, e.g. [256, 256]")
    raise TypeError(f"unsupported config type {typ!r} for {key}")  # a bug, not a user error


def check_range(key: str, value: Any, meta: Mapping[str, Any], source: str) -> None:
    """Raise ConfigError when ``value`` is not among the field's choices or within its range
    (numbers are checked to be finite by :func:`coerce`)."""
    choices, lo, hi = meta.get("choices"), meta.get("min"), meta.get("max")
    if choices is not None and value not in choices:
        allowed = ", ".join(str(c) for c in choices)
        raise ConfigError(f"{source}: {key} must be one of {allowed}, got {value!r}")
    if lo is not None and value < lo:
        limit = f"between {_bound(lo)} and {_bound(hi)}" if hi is not None else f"at least {lo}"
        raise ConfigError(f"{source}: {key} must be {limit}, got {_shown(value)}")
    if hi is not None and value > hi:
        limit = f"between {_bound(lo)} and {_bound(hi)}" if lo is not None else f"at most {hi}"
        raise ConfigError(f"{source}: {key} must be {limit}, got {_shown(value)}")


def _bound(limit: Any) -> str:
    """A range's end as a person reads it: ``1,000,000,000,000``, ``0.0``."""
    return f"{limit:,}" if isinstance(limit, int) and abs(limit) >= 10_000 else str(limit)


def _shown(value: Any) -> str:
    """A value as given, cut short when it is hundreds of digits long."""
    text = repr(value)
    return text if len(text) <= 30 else f"{text[:12]}...{text[-6:]} ({len(text)} characters)"


MAX_CONFIG_BYTES = 1 << 20  # edgerl's configs are a few KiB


def parse_toml_file(path: Path, named: bool = False, follow: bool = True) -> dict[str, Any]:
    """Read a TOML config file; raises ConfigError naming the file (and line) when it fails:
    missing, not UTF-8 text, not TOML, nested beyond reason, too large, or not a plain file
    (unless the user ``named`` it on the command line: ``--config <(...)`` is a FIFO), or a
    link without ``follow`` (a run's own config.toml)."""
    try:
        text = read_regular(path, MAX_CONFIG_BYTES, streams=named, follow=follow).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {e.start:,} cannot be read)"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(
            f"config file {path} is not a config: its values nest too deeply"
        ) from None


def parse_override(
    text: str, known: Sequence[str] = (), aliases: Mapping[str, str] | None = None
) -> tuple[str, Any]:
    """Split ``section.key=value``; the value is read as TOML, else kept as a plain string.

    Raises ConfigError for text of another shape, suggesting the key meant where there is one:
    another code base's name for it (``aliases``) or a key of ``known`` with that name.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or "." not in key:
        meant = _meant(key, known, aliases or {})
        hint = f": did you mean {meant}={raw.strip()}?" if sep and meant else ", e.g. agent.lr=3e-4"
        raise ConfigError(f"--set {text!r} must look like section.key=value{hint}")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # a plain string, checked by its field
        value = raw
    return key, value


def _meant(name: str, known: Sequence[str], aliases: Mapping[str, str]) -> str | None:
    """The key a bare ``name`` most likely stands for: an alias, a key of that name, or one
    spelled closely."""
    if name in aliases:
        return aliases[name]
    by_name = {k.rpartition(".")[2]: k for k in known}
    close = difflib.get_close_matches(name, list(by_name), n=1, cutoff=0.8)
    return by_name[close[0]] if close else None


def flatten(table: Mapping[str, Any], source: str, sections: Mapping[str, Any]) -> dict[str, Any]:
    """``{section: {name: value}}`` as ``{"section.name": value}``; raises ConfigError for a
    section not in ``sections`` or one that is not a table."""
    flat: dict[str, Any] = {}
    for section, body in table.items():
        if section not in sections:
            close = difflib.get_close_matches(section, list(sections), n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise ConfigError(f"{source}: unknown config section [{section}]{hint}")
        if not isinstance(body, Mapping):
            raise ConfigError(f"{source}: [{section}] must be a table of keys")
        for name, value in body.items():
            flat[f"{section}.{name}"] = value
    return flat
