"""``cdc config show``: every effective setting, secrets masked, and where its value came from.

The layers are those of :func:`pgcdc.core.settings.load_settings`, later beating earlier:
``default``, ``file`` (the TOML file of ``--config`` or ``CDC_CONFIG``), ``env`` (``CDC_*``
variables) and ``flag`` (the command line's ``--set``). A value holding credentials (the
DSN, the followers' URLs, passwords) is shown with its password replaced by ``***``.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, SecretStr

from cdc.connection import parse_dsn
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import Settings
from pgcdc.core.settings_sources import environment_values

MASK = "***"
SOURCES = ("default", "file", "env", "flag")


def parse_assignments(assignments: list[str]) -> dict[str, Any]:
    """``["postgres.slot_name=s1", ...]`` as the nested overrides ``load_settings`` takes."""
    out: dict[str, Any] = {}
    for text in assignments:
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set takes section.name=value, not {text!r}")
        *sections, leaf = name.strip().split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return out


def set_flag_names(overrides: Mapping[str, Any]) -> dict[str, str]:
    """``{"postgres.slot_name": "--set postgres.slot_name"}``: how each was given (without
    its value, which may be a secret)."""
    return {name: f"--set {name}" for name, _value in _flatten(overrides)}


def _flatten(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, name + ".")
        else:
            yield name, value


def _masked_url(text: str) -> str:
    """A URL (or DSN in URL form) with its password replaced."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return MASK
    if parts.password is None:
        return text
    netloc = f"{parts.username or ''}:{MASK}@{parts.hostname or ''}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _masked_dsn(dsn: str) -> str:
    """The DSN without its password, in either form; ``***`` when libpq cannot parse it."""
    if "://" in dsn:
        return _masked_url(dsn)
    try:
        params = parse_dsn(dsn)
    except ConfigError:
        return MASK
    return " ".join(
        f"{k}={MASK if k in ('password', 'sslpassword') else v}" for k, v in params.items()
    )


def _shown(name: str, value: Any) -> str:
    if isinstance(value, SecretStr):
        text = value.get_secret_value()
        if name == "postgres.dsn":
            return _masked_dsn(text)
        if name.endswith(".url"):
            return _masked_url(text)
        return MASK if text else ""
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if value is None:
        return ""
    return str(getattr(value, "value", value))


def _secret_leaves(model: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The settings' leaves as objects (SecretStr stays SecretStr), by their file name."""
    for field, info in type(model).model_fields.items():
        key = info.alias or field
        value = getattr(model, field)
        name = f"{prefix}{key}"
        if hasattr(type(value), "model_fields"):
            yield from _secret_leaves(value, name + ".")
        elif isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
            # A list of tables ([[search.documents]]): a row each, as the JSON the
            # environment takes (secrets are never kept in one).
            for i, item in enumerate(value):
                label = getattr(item, "name", None)
                at = json.dumps(label) if isinstance(label, str) else str(i)
                yield f"{name}[{at}]", json.dumps(item.model_dump(mode="json"))
        elif isinstance(value, Mapping) and value:
            for sub, v in _flatten(value):
                masked = MASK if _looks_secret(sub) else v
                yield f"{name}.{sub}", masked
        else:
            yield name, value


def _looks_secret(name: str) -> bool:
    return any(word in name.lower() for word in ("password", "secret", "token", "jaas"))


def file_values(config_file: str | None) -> dict[str, Any]:
    """The TOML file's values (``--config`` or ``CDC_CONFIG``), empty without one."""
    path = config_file or os.environ.get("CDC_CONFIG")
    if not path:
        return {}
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read: {e}") from e


def effective_rows(
    settings: Settings, config_file: str | None, overrides: Mapping[str, Any]
) -> list[tuple[str, str, str]]:
    """``(setting, shown value, source)`` for every setting, in the model's order."""
    layers = {
        "file": dict(_flatten(file_values(config_file))),
        "env": dict(_flatten(environment_values(os.environ, Settings))),
        "flag": dict(_flatten(overrides)),
    }

    def source(name: str) -> str:
        for layer in ("flag", "env", "file"):
            keys = layers[layer]
            if any(k == name or name.startswith((k + ".", k + "[")) for k in keys):
                return layer
        return "default"

    return [(n, _shown(n, v), source(n)) for n, v in _secret_leaves(settings)]


def render(rows: list[tuple[str, str, str]]) -> str:
    """The rows as aligned text: setting, value, source."""
    width = max((len(n) for n, _, _ in rows), default=0)
    vwidth = min(60, max((len(v) for _, v, _ in rows), default=0))
    return "".join(f"{n:<{width}}  {v:<{vwidth}}  ({s})\n" for n, v, s in rows)
