"""Command-line overrides of an experiment's settings: ``--set key=value`` (repeatable).

Every experiment keeps its settings in a frozen dataclass with a quick and a full preset. An
override names a field (``widths``) or, for a nested dataclass, a dotted path (``train.steps``);
its text is converted to the field's declared type and applied with ``dataclasses.replace``, so
the dataclass's own ``__post_init__`` validation runs exactly as for a preset.

Value syntax, by field type:

* ``int``, ``float``, ``str``: as written (``steps=200``, ``learning_rate=3e-3``);
* ``bool``: ``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``);
* ``X | None``: ``none`` for None, else as for ``X``;
* ``tuple[X, ...]``: comma-separated (``widths=1,2,4,8``; an empty value is the empty tuple);
* tuples of tuples: items separated by commas, the inner fields by colons
  (``teachers=2:2.0,16:2.0``).

A run with overrides records them (``overrides`` in ``config.json`` and ``summary.json``) and by
default writes to ``runs/NAME[-quick]-set-<hash>``, never into the committed default results.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dca_theory.io import to_jsonable
from dca_theory.paths import default_run_dir

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_SEPARATORS = (",", ":")  # by nesting depth: outer items, then the fields of an inner tuple


def check_at_least_one(settings: Any, *names: str) -> None:
    """A one-line ValueError naming the first of ``names`` whose value in ``settings`` is below 1
    (for the count fields of an experiment's settings: seeds, steps, sizes)."""
    for name in names:
        value = getattr(settings, name)
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def parse_assignments(items: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    """``["a=1", "b=x,y"]`` -> ``{"a": "1", "b": "x,y"}``; a mapping passes through.

    A key given twice keeps its last value (as repeated flags usually do)."""
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def type_name(tp: Any) -> str:
    """A short readable name for a field type (``tuple of int``, ``float or none``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("none" if a is type(None) else type_name(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple of {type_name(args[0])}"
        return "(" + ":".join(type_name(a) for a in args) + ")"
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    return getattr(tp, "__name__", str(tp))


def _coerce(text: str, tp: Any, depth: int = 0) -> Any:
    """Convert ``text`` to type ``tp``; raise ValueError (caught and reworded by the caller)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() == "none":
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(text, arg, depth)
            except ValueError:
                continue
        raise ValueError(text)
    if origin is tuple:
        if depth >= len(_SEPARATORS):
            raise ValueError(text)
        parts = [p.strip() for p in text.split(_SEPARATORS[depth])] if text else []
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(p, args[0], depth + 1) for p in parts)
        if len(parts) != len(args):
            raise ValueError(text)
        return tuple(_coerce(p, a, depth + 1) for p, a in zip(parts, args))
    if origin is typing.Literal:
        for option in args:
            if str(option) == text:
                return option
        raise ValueError(text)
    if tp is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(text)
    if tp is int:
        return int(text)
    if tp is float:
        value = float(text)
        if not math.isfinite(value):  # no setting means "infinite" or "not a number"
            raise ValueError("expected a finite float; nan and inf are never valid")
        return value
    if tp in (str, Path):
        return tp(text)
    raise ValueError(f"fields of type {type_name(tp)} cannot be set from the command line")


def _is_group(value: Any) -> bool:
    """Whether a setting's value is a nested dataclass (set through its dotted fields)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _fields(config: Any) -> dict[str, Any]:
    """Field name -> resolved type of a dataclass instance (string annotations resolved)."""
    hints = typing.get_type_hints(type(config))
    return {f.name: hints[f.name] for f in dataclasses.fields(config) if f.init}


def setting_names(config: Any, prefix: str = "") -> list[str]:
    """Every settable key of ``config``, nested dataclasses as dotted paths."""
    names = []
    for name in _fields(config):
        value = getattr(config, name)
        if _is_group(value):
            names += setting_names(value, f"{prefix}{name}.")
        else:
            names.append(prefix + name)
    return names


def _changes(config: Any, path: list[str], text: str, key: str, valid: list[str]) -> tuple:
    """``(field name, new value)`` for one override; nested dataclasses give a dict of changes."""
    fields = _fields(config)
    name = path[0]
    if name not in fields:
        raise ValueError(f"unknown setting {key!r}; valid: {', '.join(valid)}")
    current = getattr(config, name)
    is_group = _is_group(current)
    if len(path) > 1:
        if not is_group:
            raise ValueError(f"unknown setting {key!r}; valid: {', '.join(valid)}")
        return name, dict([_changes(current, path[1:], text, key, valid)])
    if is_group:
        raise ValueError(f"setting {key!r} is a group; set one of its fields "
                         f"({', '.join(n for n in valid if n.startswith(key + '.'))})")
    try:
        value = _coerce(text, fields[name])
    except ValueError as err:
        detail = (str(err) if "cannot be set" in str(err) or "finite" in str(err)
                  else f"expected {type_name(fields[name])}")
        raise ValueError(f"bad value for setting {key!r}: {text!r} ({detail})") from None
    return name, value


def _merge(changes: dict, name: str, value: Any) -> None:
    if isinstance(value, dict) and isinstance(changes.get(name), dict):
        for inner, v in value.items():
            _merge(changes[name], inner, v)
    else:
        changes[name] = value


def _replace(config: Any, changes: dict) -> Any:
    """One ``dataclasses.replace`` per dataclass, so that settings which must change together
    (a smaller ``dim`` and smaller ``widths``) are validated together."""
    resolved = {name: _replace(getattr(config, name), v) if isinstance(v, dict) else v
                for name, v in changes.items()}
    return dataclasses.replace(config, **resolved)


def apply_overrides(config: Any, overrides: Sequence[str] | Mapping[str, str] = ()) -> Any:
    """``config`` with every ``key=value`` of ``overrides`` applied (validated by the
    dataclass); ``config`` itself when there are none."""
    assignments = parse_assignments(overrides)
    if not assignments:
        return config
    valid = setting_names(config)
    changes: dict = {}
    for key, text in assignments.items():
        _merge(changes, *_changes(config, key.split("."), text, key, valid))
    return _replace(config, changes)


def describe(config: Any, prefix: str = "") -> list[str]:
    """One line per setting: ``name  type  = value``, for ``dca-theory run NAME --show``."""
    lines = []
    fields = _fields(config)
    for name, tp in fields.items():
        value = getattr(config, name)
        if _is_group(value):
            lines += describe(value, f"{prefix}{name}.")
        else:
            lines.append(f"{prefix + name:28s} {type_name(tp):24s} = {_show(value)}")
    return lines


def _show(value: Any) -> str:
    """A value as it would be written after ``--set key=``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        inner = [":".join(_show(v) for v in x) if isinstance(x, tuple) else _show(x)
                 for x in value]
        return ",".join(inner)
    return str(value)


def record(config: Any, overrides: Sequence[str] | Mapping[str, str] = ()) -> Any:
    """What ``config.json`` holds: ``config`` unchanged without overrides (so default runs
    write the same file as always), else its fields plus ``overrides`` (key -> text given)."""
    assignments = parse_assignments(overrides)
    if not assignments:
        return config
    return {**to_jsonable(config), "overrides": assignments}


def summary_entry(overrides: Sequence[str] | Mapping[str, str] = ()) -> dict:
    """``{"overrides": {key: text}}`` for a summary, or ``{}`` without overrides (default runs
    keep their usual summary)."""
    assignments = parse_assignments(overrides)
    return {"overrides": assignments} if assignments else {}


def run_dir(name: str, quick: bool, overrides: Sequence[str] | Mapping[str, str] = ()) -> Path:
    """The default run directory: the experiment's usual one without overrides, else
    ``runs/NAME[-quick]-set-<hash of the overrides>``, so a customised run never lands in (or
    is mistaken for) the committed default results."""
    assignments = parse_assignments(overrides)
    if not assignments:
        return default_run_dir(name, quick)
    digest = hashlib.sha256(json.dumps(assignments, sort_keys=True).encode()).hexdigest()[:8]
    return Path("runs") / f"{name}{'-quick' if quick else ''}-set-{digest}"
