"""Configuration: frozen, validated dataclasses loaded in one place.

Every component declares its settings as a frozen dataclass whose ``__post_init__`` validates
values (raising :class:`ConfigError` with a message that says what to change). :func:`load_config`
fills such a dataclass from, in increasing precedence: field defaults, a TOML file (optionally one
``[section]`` of it), environment variables ``KVCAKE_<SECTION>_<FIELD>``, and explicit overrides
(command-line flags). Nested dataclass fields read nested TOML tables.

Sizes may be written as ints or strings such as ``"16MB"`` or ``"1GiB"`` when the field is
declared with ``metadata={"size": True}`` (see :func:`size_field`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from kvcake.core.errors import ConfigError

T = TypeVar("T")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(value: int | str) -> int:
    """``"16MB"`` -> 16_000_000, ``"16MiB"`` -> 16_777_216, ``4096`` -> 4096.

    Percentages and negative values are rejected (Mooncake rejects ``"50%"`` too)."""
    if isinstance(value, bool):
        raise ConfigError(f"size must be a number of bytes or a string like '16MB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"size must be >= 0, got {value}")
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(
            f"cannot parse size {value!r}: use bytes or a unit (e.g. '512MB', '2GiB')"
        )
    number, prefix, binary = float(m.group(1)), m.group(2).lower(), bool(m.group(3))
    power = " kmgt".index(prefix or " ")
    return int(number * (1024 if binary else 1000) ** power)


def size_field(default: int | str, help: str = "") -> Any:
    """A dataclass field holding a byte size (accepts ``"16MB"`` style strings)."""
    return dataclasses.field(default=parse_size(default), metadata={"size": True, "help": help})


def setting(default: Any, help: str) -> Any:
    """A dataclass field with its one-line ``help``: the ``--<field-name>`` flag's help text
    (:func:`add_config_flags`), the one place a setting is explained."""
    return dataclasses.field(default=default, metadata={"help": help})


def _default_of(f: dataclasses.Field[Any]) -> Any:
    """The default as ``--help`` shows it (an empty string as ``""``)."""
    if f.default is not dataclasses.MISSING:
        return '""' if f.default == "" else f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_config_flags(
    p: argparse.ArgumentParser,
    cls: type,
    only: Sequence[str] = (),
    skip: Sequence[str] = (),
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """One ``--<field-name>`` flag per field of ``cls`` (``only``: just those, in that order;
    nested dataclasses never), with the field's ``metadata["help"]`` and its default. Every
    flag defaults to None and takes a string, so :func:`load_config` (``overrides``) converts
    and checks only the flags given, with the TOML file's and the environment's rules.
    ``aliases``: more option strings for a field (a short name users already type). Returns
    the field names, for :func:`flag_overrides`."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    names = [n for n in (list(only) or by_name) if n not in skip]
    names = [n for n in names if not dataclasses.is_dataclass(hints[n])]
    for name in names:
        f = by_name[name]
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "str")
        kind = "SIZE" if f.metadata.get("size") else kind.split("|")[0].strip().upper()
        text = f.metadata.get("help", "")
        p.add_argument(
            f"--{name.replace('_', '-')}",
            *(aliases or {}).get(name, ()),
            dest=name,
            default=None,
            metavar=kind,
            help=f"{text} (default: {_default_of(f)})".lstrip(),
        )
    return names


def flag_overrides(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The ``overrides`` of :func:`load_config` from the flags of :func:`add_config_flags`."""
    return {n: getattr(args, n, None) for n in names}


def require(condition: bool, message: str) -> None:
    """Validation helper for ``__post_init__``: raise :class:`ConfigError` unless ``condition``."""
    if not condition:
        raise ConfigError(message)


def _coerce(name: str, tp: Any, value: Any, is_size: bool) -> Any:
    if is_size:
        return parse_size(value)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(name, inner[0], value, False)
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else list(value)
        return tuple(_coerce(name, args[0], v, False) for v in items if v != "")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        return _build(tp, value, name)
    try:
        if tp is bool:
            if isinstance(value, str):
                low = value.strip().lower()
                if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(value)
                return low in ("1", "true", "yes", "on")
            return bool(value)
        if tp in (int, float):
            if isinstance(value, bool):
                raise ValueError(value)
            return tp(value)
        if tp is str:
            return str(value)
        if tp is Path:
            return Path(os.path.expanduser(str(value)))
        if isinstance(tp, type) and issubclass(tp, Enum):
            return tp(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: cannot use {value!r} as {getattr(tp, '__name__', tp)}") from exc
    return value


def _build(cls: type[T], values: Mapping[str, Any], where: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {', '.join(unknown)} in {where or cls.__name__}; "
            f"valid: {', '.join(sorted(fields))}"
        )
    kwargs = {
        k: _coerce(
            f"{where}.{k}" if where else k, hints[k], v, bool(fields[k].metadata.get("size"))
        )
        for k, v in values.items()
    }
    return cls(**kwargs)


def _env_values(cls: type, prefix: str, env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}".upper()
        if key in env:
            out[f.name] = env[key]
    return out


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML file, turning I/O and syntax problems into :class:`ConfigError`."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {p} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc


def load_config(
    cls: type[T],
    *,
    toml_path: str | os.PathLike[str] | None = None,
    section: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build ``cls`` from defaults < TOML ``[section]`` < ``KVCAKE_<SECTION>_<FIELD>`` < overrides.

    ``None`` values in ``overrides`` are ignored, so argparse namespaces can be passed as they are.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    values: dict[str, Any] = {}
    if toml_path is not None:
        data = read_toml(toml_path)
        if section:
            for part in section.split("."):
                data = data.get(part, {})
                if not isinstance(data, dict):
                    raise ConfigError(f"[{section}] in {toml_path} must be a table")
        values.update(data)
    prefix = f"KVCAKE_{section.replace('.', '_')}_" if section else "KVCAKE_"
    values.update(_env_values(cls, prefix, os.environ if env is None else env))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return _build(cls, values, section or "")


@dataclasses.dataclass(frozen=True)
class KVLayoutConfig:
    """The one block-size setting and the names that make up store keys (design.md)."""

    model: str = "SmolLM2-135M-Instruct"
    dtype: str = "float32"
    kv_block_tokens: int = 32

    def __post_init__(self) -> None:
        require(self.model.strip() != "", "kv.model must not be empty")
        require("/" not in self.model, "kv.model must not contain '/' (it is part of store keys)")
        require(
            self.dtype in ("float32", "float16", "bfloat16"),
            f"kv.dtype must be float32, float16 or bfloat16, got {self.dtype!r}",
        )
        require(
            1 <= self.kv_block_tokens <= 65536,
            f"kv.kv_block_tokens must be in [1, 65536], got {self.kv_block_tokens}",
        )
