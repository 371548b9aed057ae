"""Mooncake's three command-line programs as kvcake stand-ins: ``mooncake_master``
(:mod:`kvcake.commands._mooncake_master`: a kvcake master with Mooncake's command line), ``mooncake_client`` (:mod:`.real_client`) and
``transfer_engine_bench`` (:mod:`.te_bench`). They are small scripts written only by
``kvcake mooncake-shim install`` (into this venv's scripts directory, or ``TARGET/bin`` with
``--target``), each carrying a marker line, so ``uninstall`` removes only kvcake's and
``install`` never writes over another program of the same name."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

MARK = "# KVCAKE_SHIM:"
PROGRAMS: dict[str, tuple[str, str]] = {  # name -> (import, call)
    "mooncake_master": ("from kvcake.commands._mooncake_master import main", "main()"),
    "mooncake_client": ("from kvcake.compat.mooncake.real_client import main", "main()"),
    "transfer_engine_bench": ("from kvcake.compat.mooncake.te_bench import main", "main()"),
}


@dataclass(frozen=True)
class Program:
    name: str
    path: Path
    ours: bool

    def describe(self) -> str:
        return f"{self.name}: {'kvcake' if self.ours else 'NOT kvcake (left alone)'} ({self.path})"


def scripts_dir(target: Path | None = None) -> Path:
    """Where the programs go: ``TARGET/bin`` with a target, else this venv's scripts dir."""
    return target / "bin" if target is not None else Path(sysconfig.get_paths()["scripts"])


def script_text(name: str) -> str:
    imp, call = PROGRAMS[name]
    return (
        f"#!{sys.executable}\n"
        f"{MARK} kvcake's stand-in for Mooncake's {name}, written by "
        "`kvcake mooncake-shim install` (`kvcake mooncake-shim uninstall` removes it)\n"
        f"import sys\n\n{imp}\n\nsys.exit({call})\n"
    )


def is_ours(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return MARK.encode() in head


def present(bin_dir: Path) -> list[Program]:
    """The programs of these names in ``bin_dir`` (kvcake's or not)."""
    return [
        Program(name, bin_dir / name, is_ours(bin_dir / name))
        for name in PROGRAMS
        if (bin_dir / name).exists()
    ]


def foreign(bin_dir: Path) -> list[Program]:
    """Programs of these names in ``bin_dir`` that are not kvcake's (install must not touch)."""
    return [p for p in present(bin_dir) if not p.ours]


def install(bin_dir: Path) -> list[Path]:
    """Write the three scripts (callers check :func:`foreign` first)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name in PROGRAMS:
        path = bin_dir / name
        tmp = path.with_name(f".{name}.kvcake-tmp")
        tmp.write_text(script_text(name))
        tmp.chmod(0o755)
        os.replace(tmp, path)
        out.append(path)
    return out


def uninstall(bin_dir: Path) -> list[Path]:
    """Remove kvcake's scripts from ``bin_dir``; others of the same names stay."""
    gone = []
    for prog in present(bin_dir):
        if prog.ours:
            prog.path.unlink()
            gone.append(prog.path)
    return gone


def on_path(name: str, path: str | None = None) -> Program | None:
    """The program ``name`` a shell would run (``$PATH``, or ``path``)."""
    found = shutil.which(name, path=path)
    return Program(name, Path(found), is_ours(Path(found))) if found else None


def status_lines(bin_dir: Path) -> list[str]:
    """What ``kvcake mooncake-shim status`` says about the programs."""
    lines = [f"program {p.describe()}" for p in present(bin_dir)]
    if not lines:
        lines.append(f"programs: none in {bin_dir}")
    for name in PROGRAMS:
        first = on_path(name)
        if first is not None and first.path.parent.resolve() != bin_dir.resolve():
            lines.append(f"  on PATH first: {first.describe()}")
    return lines
