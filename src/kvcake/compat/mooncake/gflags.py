"""gflags' command-line syntax and errors, as Mooncake's C++ programs (gflags 2.1.2, the 0.3.13
wheel's) parse them, for kvcake's stand-ins of those programs (:mod:`.programs`).

Forms: ``--name=value``, ``-name=value``, ``--name value`` (not for bools), ``--bool`` /
``--nobool``, ``--flagfile=F`` (one flag a line, ``#`` comments), ``--fromenv=a,b`` /
``--tryfromenv=a,b`` (``FLAGS_a`` variables), ``--undefok=a,b``, ``--`` ends the flags; flags
may follow positional arguments. Errors are gflags' words, on stderr, exit status 1:
``ERROR: unknown command line flag 'x'``. The flag tables are :mod:`.flag_catalog`."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

_TRUE = ("1", "t", "true", "y", "yes")
_FALSE = ("0", "f", "false", "n", "no")
_INT_RANGE = {
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint32": (0, (1 << 32) - 1),
    "uint64": (0, (1 << 64) - 1),
}
MAX_FLAGFILE_DEPTH = 16  # a flagfile naming itself must not recurse for ever


class GFlagsExit(Exception):
    """End the program as gflags would: ``message`` on stderr (or stdout for help), ``code``."""

    def __init__(self, code: int, message: str, to_stdout: bool = False):
        super().__init__(message)
        self.code, self.message, self.to_stdout = code, message, to_stdout

    def exit(self) -> int:
        out = sys.stdout if self.to_stdout else sys.stderr
        try:
            print(self.message, file=out, flush=True)
        except BrokenPipeError:  # `--help | head`: the reader left; silence the final flush
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return self.code


@dataclass(frozen=True)
class GFlag:
    name: str
    kind: str  # bool, int32, int64, uint32, uint64, double, string
    default: str
    note: str = ""  # what kvcake does with it (the help text)


def table(text: str, note: str = "") -> dict[str, GFlag]:
    """Flags from lines ``name kind default`` (``''`` = the empty string)."""
    out = {}
    for line in text.strip().splitlines():
        name, kind, *rest = line.split(maxsplit=2)
        default = rest[0] if rest else ""
        out[name] = GFlag(name, kind, "" if default == "''" else default, note)
    return out


def to_bool(text: str) -> bool | None:
    low = text.strip().lower()
    return True if low in _TRUE else False if low in _FALSE else None


def _strtol(text: str) -> int:
    """C's strtol with base 0 (gflags' integer parsing): 0x.. hex, 0.. octal, else decimal."""
    body = text.strip()
    sign = -1 if body.startswith("-") else 1
    digits = body.lstrip("+-")
    if digits[:2].lower() == "0x":
        return sign * int(digits[2:], 16)
    if len(digits) > 1 and digits.startswith("0"):
        return sign * int(digits[1:], 8)
    return sign * int(digits, 10)


def check_value(flag: GFlag, value: str) -> str | None:
    """``value`` normalised for ``flag``'s type (bools ``true``/``false``, integers decimal),
    None when gflags would call it illegal."""
    if flag.kind == "bool":
        b = to_bool(value)
        return None if b is None else ("true" if b else "false")
    if flag.kind in _INT_RANGE:
        lo, hi = _INT_RANGE[flag.kind]
        try:
            n = _strtol(value)
        except ValueError:
            return None
        if flag.kind.startswith("u") and value.strip().startswith("-"):
            return None
        return str(n) if lo <= n <= hi else None
    if flag.kind == "double":
        try:
            return repr(float(value))
        except ValueError:
            return None
    return value


@dataclass
class Parsed:
    values: dict[str, str] = field(default_factory=dict)  # given, by name, normalised
    rest: list[str] = field(default_factory=list)  # positional arguments
    unknown: list[str] = field(default_factory=list)  # names gflags has not placed yet

    def flag(self, name: str, flags: Mapping[str, GFlag]) -> str:
        return self.values.get(name, flags[name].default)


class _Parser:
    def __init__(self, flags: Mapping[str, GFlag], env: Mapping[str, str]):
        self.flags, self.env, self.out = flags, env, Parsed()

    def args(self, argv: list[str], depth: int = 0) -> None:
        i = 0
        while i < len(argv):
            arg = argv[i]
            i += 1
            if arg == "--":
                self.out.rest.extend(argv[i:])
                return
            if not arg.startswith("-") or arg == "-":
                self.out.rest.append(arg)
                continue
            name, eq, value = arg.lstrip("-").partition("=")
            flag = self.flags.get(name)
            if flag is not None and flag.kind != "bool" and not eq:
                if i >= len(argv):
                    raise GFlagsExit(1, f"ERROR: flag '{arg}' is missing its argument; "
                                        f"flag description: {flag.note}")  # fmt: skip
                value, eq = argv[i], "="
                i += 1
            self.one(name, value if eq else None, depth)

    def one(self, name: str, value: str | None, depth: int) -> None:
        flag = self.flags.get(name)
        if flag is None and value is None and name.startswith("no") and name[2:] in self.flags:
            flag, value = self.flags[name[2:]], "false"
            if flag.kind != "bool":
                raise GFlagsExit(1, f"ERROR: boolean value ({name}) specified for "
                                    f"{flag.kind} command line flag")  # fmt: skip
        if flag is None:
            self.out.unknown.append(name)
            return
        text = check_value(flag, "true" if value is None else value)
        if text is None:
            raise GFlagsExit(1, f"ERROR: illegal value '{value}' specified for {flag.kind} "
                                f"flag '{flag.name}'")  # fmt: skip
        self.out.values[flag.name] = text
        if flag.name == "flagfile" and text:
            self.flagfile(text, depth)
        elif flag.name in ("fromenv", "tryfromenv") and text:
            self.from_env(text, required=flag.name == "fromenv")

    def flagfile(self, paths: str, depth: int) -> None:
        if depth >= MAX_FLAGFILE_DEPTH:
            raise GFlagsExit(1, f"ERROR: --flagfile nested more than {MAX_FLAGFILE_DEPTH} deep")
        for path in paths.split(","):
            try:
                lines = Path(path).read_text().splitlines()
            except OSError as exc:
                raise GFlagsExit(1, f"{path}: {exc.strerror or exc}") from exc
            # a line not starting with '-' names programs the following flags are for: kept
            flags = [s for s in (x.strip() for x in lines) if s.startswith("-")]
            for line in flags:  # one flag a line: --name=value or a bare --bool
                name, eq, value = line.lstrip("-").partition("=")
                self.one(name, value if eq else None, depth + 1)

    def from_env(self, names: str, required: bool) -> None:
        for name in filter(None, names.split(",")):
            if name not in self.flags:
                raise GFlagsExit(1, f"ERROR: unknown command line flag '{name}' "
                                    "(via --fromenv or --tryfromenv)")  # fmt: skip
            value = self.env.get(f"FLAGS_{name}")
            if value is None:
                if required:
                    raise GFlagsExit(1, f"ERROR: FLAGS_{name} not found in environment")
                continue
            self.one(name, value, 0)


def parse(
    flags: Mapping[str, GFlag], argv: list[str], env: Mapping[str, str] | None = None
) -> Parsed:
    """Parse ``argv`` as gflags does; raises :class:`GFlagsExit` where gflags exits."""
    p = _Parser(flags, os.environ if env is None else env)
    p.args(argv)
    undefok = set(p.out.values.get("undefok", "").split(","))
    for name in p.out.unknown:
        if name not in undefok and not (name.startswith("no") and name[2:] in undefok):
            raise GFlagsExit(1, f"ERROR: unknown command line flag '{name}'")
    p.out.unknown.clear()
    return p.out


def help_text(prog: str, sections: Mapping[str, Mapping[str, GFlag]]) -> str:
    """gflags' ``--help`` layout: each section's flags with type, default and kvcake's use."""
    lines = [f"{prog}: kvcake's stand-in for Mooncake's {prog} (docs/compat/mooncake.md)", ""]
    for title, flags in sections.items():
        lines.append(f"  Flags of {title}:")
        for f in sorted(flags.values(), key=lambda f: f.name):
            default = f'"{f.default}"' if f.kind == "string" else f.default
            lines.append(f"    -{f.name} ({f.note}) type: {f.kind} default: {default}")
        lines.append("")
    return "\n".join(lines)
