"""Where each setting came from, and what is wrong with it: the settings loader's bookkeeping.

:func:`pgcdc.core.settings.load_settings` reads three layers (the TOML file, the ``CDC_*``
environment, flags) and validates their merge once, so every invalid value is reported at
once, each naming where it came from: the variable, the file and its line, or the flag. A
``CDC_*`` variable that names no setting stops the start as well, naming the closest valid
one: a mistyped ``CDC_POSTGRES_DSN`` would otherwise leave the default DSN in force and
capture the local stack's database instead of the user's.

The environment is read here, not by pydantic-settings, with its rules (names in any case,
``__`` between section and name, a section or a table as JSON, a table's key after a second
``__``), so that each value keeps the name of the variable it came from. A secret's value is
never quoted.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, SecretStr

PREFIX = "CDC_"
# CDC_* variables that are not settings: the config file's path, and the test suite's own
# switches (CDC_TEST_NATIVE).
NOT_SETTINGS = ("CDC_CONFIG",)
OTHER_PREFIXES = ("CDC_TEST_",)
SETTINGS_DOC = "docs/settings.md"

Path = tuple[str, ...]
# Where pydantic found a problem: names, and the index of an element of a list
# ([[search.documents]] and the lists inside them).
Loc = tuple[str | int, ...]


@dataclass
class Layers:
    """The raw values of each layer and the name each value came by."""

    file_path: str | None = None
    file_text: str = ""
    file: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    env_names: dict[Loc, str] = field(default_factory=dict)  # path -> variable
    flags: dict[str, Any] = field(default_factory=dict)
    flag_names: dict[str, str] = field(default_factory=dict)  # "a.b" -> "--flag"
    problems: list[str] = field(default_factory=list)  # found while reading


def _model_fields(model: type[BaseModel]) -> dict[str, Any]:
    """Field name (as the file and the environment spell it) -> annotation."""
    return {(info.alias or name): info.annotation for name, info in model.model_fields.items()}


def _unwrap(annotation: Any) -> Any:
    """The annotation without ``Annotated`` and ``| None``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else annotation
    return annotation


def _is_section(annotation: Any) -> bool:
    a = _unwrap(annotation)
    return isinstance(a, type) and issubclass(a, BaseModel)


def _is_table(annotation: Any) -> bool:
    return typing.get_origin(_unwrap(annotation)) is dict


def is_secret(annotation: Any) -> bool:
    """A SecretStr field (its value is never quoted)."""
    return _unwrap(annotation) is SecretStr


def _item(annotation: Any) -> Any | None:
    """The element type of a ``tuple[X, ...]`` or ``list[X]`` setting (None otherwise)."""
    a = _unwrap(annotation)
    if typing.get_origin(a) in (tuple, list):
        args = [x for x in typing.get_args(a) if x is not Ellipsis]
        return args[0] if len(args) == 1 else None
    return None


def _field(root: type[BaseModel], path: Loc) -> Any | None:
    """The annotation at ``path`` (None when no such setting); a key of a table setting
    has the table's annotation."""
    annotation: Any = root
    for part in path:
        a = _unwrap(annotation)
        if isinstance(part, int):
            annotation = _item(a)
        elif _is_section(a):
            annotation = _model_fields(a).get(part)
        else:
            return annotation if _is_table(a) else None
        if annotation is None:
            return None
    return annotation if path else None


def variable_names(root: type[BaseModel]) -> list[str]:
    """Every ``CDC_*`` name that is a setting (or a whole section as JSON)."""
    names = [*NOT_SETTINGS]
    for name, annotation in _model_fields(root).items():
        names.append(f"{PREFIX}{name.upper()}")
        if _is_section(annotation):
            for sub in _model_fields(_unwrap(annotation)):
                names.append(f"{PREFIX}{name.upper()}__{sub.upper()}")
    return names


def setting_names(root: type[BaseModel]) -> list[str]:
    """Every setting's dotted name, as the file and ``--set`` spell it."""
    out = []
    for name, annotation in _model_fields(root).items():
        if _is_section(annotation):
            out += [f"{name}.{sub}" for sub in _model_fields(_unwrap(annotation))]
        else:
            out.append(name)
    return out


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def closest(name: str, candidates: list[str]) -> str | None:
    """The candidate ``name`` most likely meant: equal but for separators, else the nearest
    by spelling; None when nothing is near."""
    squashed = _squash(name)
    for c in candidates:
        if _squash(c) == squashed:
            return c
    found = difflib.get_close_matches(name.upper(), [c.upper() for c in candidates], 1, 0.75)
    if not found:
        return None
    return next(c for c in candidates if c.upper() == found[0])


def _unknown_variable(name: str, root: type[BaseModel]) -> str:
    valid = variable_names(root)
    guess = closest(name, valid)
    line = f"{name} is not a setting"
    if guess is None:
        return f"{line}: unset it or rename it ({SETTINGS_DOC} lists every variable)"
    why = ""
    if "__" in guess[len(PREFIX) :] and "__" not in name[len(PREFIX) :]:
        why = " (two underscores between the section and the name)"
    return f"{line}: did you mean {guess}?{why} Rename or unset it ({SETTINGS_DOC})"


def read_environment(environ: Mapping[str, str], root: type[BaseModel], layers: Layers) -> None:
    """The ``CDC_*`` variables as nested raw values in ``layers.env`` (with the name of each
    in ``layers.env_names``); a name that is no setting, or a table that is not JSON, is a
    problem in ``layers.problems``."""
    fields = _model_fields(root)
    sections: dict[str, dict[str, Any]] = {}
    fields_set: list[tuple[str, str, Path, Any]] = []  # (variable, raw, path, annotation)
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(PREFIX) or upper in NOT_SETTINGS:
            continue
        if any(upper.startswith(p) for p in OTHER_PREFIXES):
            continue
        parts = tuple(p.lower() for p in upper[len(PREFIX) :].split("__"))
        annotation = fields.get(parts[0])
        if annotation is None or not all(parts):
            layers.problems.append(_unknown_variable(variable, root))
            continue
        raw = environ[variable]
        if len(parts) == 1 and _is_section(annotation):
            decoded = _json(variable, raw, layers)
            if decoded is not None:
                sections[parts[0]] = decoded
                layers.env_names[parts] = variable
            continue
        if len(parts) == 1:
            fields_set.append((variable, raw, parts, annotation))
            continue
        if not _is_section(annotation):
            layers.problems.append(_unknown_variable(variable, root))
            continue
        sub = _model_fields(_unwrap(annotation)).get(parts[1])
        if sub is None or (len(parts) > 2 and not _is_table(sub)) or len(parts) > 3:
            layers.problems.append(_unknown_variable(variable, root))
            continue
        fields_set.append((variable, raw, parts, sub))
    env: dict[str, Any] = {k: dict(v) for k, v in sections.items()}
    for variable, raw, path, annotation in fields_set:
        value: Any = raw
        if len(path) == 2 and _is_table(annotation):
            value = _json(variable, raw, layers)
            if value is None:
                continue
        elif len(path) == 2 and _is_section(_item(annotation)):
            value = _json_list(variable, raw, layers)  # a list of tables: [{...}, ...]
            if value is None:
                continue
        node = env
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = value
        layers.env_names[path] = variable
    layers.env = env


def environment_values(environ: Mapping[str, str], root: type[BaseModel]) -> dict[str, Any]:
    """The settings the ``CDC_*`` variables set, as nested raw values (problems left out)."""
    layers = Layers()
    read_environment(environ, root, layers)
    return layers.env


def _json(variable: str, raw: str, layers: Layers) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError as e:
        layers.problems.append(
            f"{variable} is not valid JSON ({e}): a table is written as JSON, "
            'e.g. {"client.id": "app"}'
        )
        return None
    if not isinstance(value, dict):
        layers.problems.append(f"{variable} must be a JSON object ({{...}}), not {raw[:40]!r}")
        return None
    return value


def _json_list(variable: str, raw: str, layers: Layers) -> list[Any] | None:
    try:
        value = json.loads(raw)
    except ValueError as e:
        layers.problems.append(
            f"{variable} is not valid JSON ({e}): a list of tables is written as a JSON "
            'list, e.g. [{"name": "a"}, {"name": "b"}]'
        )
        return None
    if not isinstance(value, list):
        layers.problems.append(f"{variable} must be a JSON list ([...]), not {raw[:40]!r}")
        return None
    return value


def _at(values: Any, path: Loc) -> tuple[bool, Any]:
    """(found, the value at ``path`` in nested raw values)."""
    node: Any = values
    for part in path:
        if isinstance(part, int):
            if not isinstance(node, list | tuple) or not 0 <= part < len(node):
                return False, None
        elif not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _has(values: Mapping[str, Any], path: Loc) -> bool:
    return _at(values, path)[0]


def toml_line(text: str, path: Loc) -> int | None:
    """The line of ``text`` (a TOML file) that sets ``path``, as far as a plain reading of
    its tables, arrays of tables (``[[search.documents]]``, the n-th is index n) and keys
    tells (dotted and quoted keys included); for a table of an array, its header's line."""
    table: Loc = ()
    counts: dict[Loc, int] = {}  # an array of tables -> its last element's index
    for no, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("["):
            array = stripped.startswith("[[")
            inner = stripped.lstrip("[").split("]")[0]
            table = ()
            parts = _key_parts(inner)
            for i, part in enumerate(parts):
                table += (part,)
                if table in counts and (i < len(parts) - 1):
                    table += (counts[table],)  # inside the array's last element
            if array:
                counts[table] = counts.get(table, -1) + 1
                table += (counts[table],)
            if path == table or (array and path == table[:-1]):
                return no  # the table itself, or the first table of the array
            continue
        key, sep, _ = stripped.partition("=")
        if not sep or stripped.startswith("#"):
            continue
        full = table + _key_parts(key)
        if full and path[: len(full)] == full:
            return no
    return None


def _key_parts(key: str) -> Path:
    return tuple(p.strip().strip("\"'") for p in key.strip().split(".") if p.strip())


def _source(path: Loc, layers: Layers) -> str:
    """Where the value at ``path`` came from, for a person."""
    dotted = ".".join(str(p) for p in path)
    for i in range(len(path), 0, -1):
        flag = layers.flag_names.get(".".join(str(p) for p in path[:i]))
        if flag is not None and _has(layers.flags, path[:i]):
            return flag
    if _has(layers.flags, path):
        return f"--set {dotted}"
    for i in range(len(path), 0, -1):
        variable = layers.env_names.get(path[:i])
        if variable is not None and _has(layers.env, path[:i]):
            return variable
    if _has(layers.file, path) and layers.file_path:
        line = toml_line(layers.file_text, path)
        return f"{layers.file_path} line {line}" if line else layers.file_path
    return "default"


def _sources_under(path: Path, layers: Layers) -> list[str]:
    """Where every value set inside the section ``path`` came from."""
    out: list[str] = []
    for values in (layers.flags, layers.env, layers.file):
        node: Any = values
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            for key in node:
                where = _source((*path, key), layers)
                if where not in out and where != "default":
                    out.append(where)
    return out


def _secret_key(path: Loc) -> bool:
    """A key of a table setting that may hold a secret (``kafka.client`` ``sasl.password``)."""
    return any(
        w in str(part).lower() for part in path for w in ("password", "secret", "token", "jaas")
    )


def _raw(path: Loc, layers: Layers) -> Any:
    """The raw value at ``path`` in the layer it comes from (a list is taken whole from one)."""
    for values in (layers.flags, layers.env, layers.file):
        found, value = _at(values, path)
        if found:
            return value
    return None


def _place(path: Loc, layers: Layers) -> str:
    """``path`` for a person, an element of a list by its name where it has one:
    ``search.documents["products"].lookups["category"].references``."""
    out = ""
    for i, part in enumerate(path):
        if isinstance(part, int):
            element = _raw(path[: i + 1], layers)
            name = element.get("name") if isinstance(element, Mapping) else None
            out += f"[{json.dumps(name)}]" if isinstance(name, str) and name else f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _parent_model(root: type[BaseModel], path: Loc) -> type[BaseModel] | None:
    """The model that holds the last part of ``path`` (None: a table's key, or nothing)."""
    parent = _unwrap(_field(root, path[:-1])) if len(path) > 1 else root
    return parent if _is_section(parent) else None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(error: Mapping[str, Any], root: type[BaseModel], layers: Layers) -> str:
    """One line for one pydantic error: the setting, its value (unless secret), where it came
    from, and what is wrong (for an unknown name, the closest one)."""
    path: Loc = tuple(error["loc"])
    dotted = _place(path, layers)
    annotation = _field(root, path)
    in_list = any(isinstance(p, int) for p in path)
    if error["type"] == "extra_forbidden":
        where = _source(path, layers)
        parent = _parent_model(root, path)
        if in_list and parent is not None:  # a key of a list's element: name its keys
            keys = list(_model_fields(parent))
            guess = closest(str(path[-1]), keys)
            hint = f": did you mean {guess}?" if guess else ""
            return f"{dotted} (from {where}) is not a setting{hint} (keys: {', '.join(keys)})"
        guess = closest(dotted, setting_names(root))
        hint = f": did you mean {guess}?" if guess else ""
        return f"{dotted} (from {where}) is not a setting{hint} ({SETTINGS_DOC} lists them all)"
    if error["type"] == "missing" and len(path) > 1:
        parent = _parent_model(root, path)
        info = parent.model_fields.get(str(path[-1])) if parent is not None else None
        meaning = f": {info.description}" if info is not None and info.description else ""
        return f"missing setting {dotted} (in {_source(path[:-1], layers)}){meaning}"
    msg = str(error["msg"]).removeprefix("Value error, ")
    if annotation is not None and _is_section(annotation) and len(path) == 1:
        # A check across a section's settings (e.g. kafka's security): name all it read.
        where = ", ".join(_sources_under((str(path[0]),), layers)) or "default"
        return f"invalid settings in [{dotted}] (from {where}): {msg}"
    where = _source(path, layers)
    secret = annotation is not None and (is_secret(annotation) or _secret_key(path))
    # A table in a list, or the list, is not quoted either: the message says what is wrong.
    hidden = (
        annotation is None
        or secret
        or (in_list and _is_section(annotation))
        or _is_section(_item(annotation))  # a list of tables
    )
    value = "" if hidden else f" = {_shown(error['input'])}"
    if secret:
        where += ", value not shown"
    return f"invalid setting {dotted}{value} (from {where}): {msg}"


def report(problems: list[str]) -> str:
    """The one message of every problem: a line alone, or a count and a line each."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems with the settings:\n" + "\n".join(
        f"  - {p}" for p in problems
    )
