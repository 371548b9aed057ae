"""The explicit switch: a thin ``mooncake`` package whose ``mooncake.store`` and
``mooncake.engine`` *are* kvcake's (``sys.modules`` aliases), written into a site-packages
directory on request and removed again. It is never written over, or in front of, a real
Mooncake: :func:`install` refuses while one is importable. A marker file tells the shim from the
wheel, so :func:`uninstall` never deletes a real Mooncake. The same switch writes (and removes)
the stand-ins for Mooncake's programs, ``mooncake_master``, ``mooncake_client`` and
``transfer_engine_bench`` (:mod:`.programs`)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from kvcake.compat.mooncake import programs
from kvcake.core.errors import KvcakeError

MARKER = "KVCAKE_SHIM"
FILES = {
    "__init__.py": (
        '"""kvcake\'s stand-in for Mooncake, written by `kvcake mooncake-shim install`\n'
        '(`kvcake mooncake-shim uninstall` removes it)."""\n\n'
        "from kvcake.compat.mooncake._buffer_pool import BufferPool, RegisteredBufferPool\n\n"
        "__kvcake_shim__ = True\n"
        '__all__ = ["BufferPool", "RegisteredBufferPool"]\n'
    ),
    "store.py": (
        '"""mooncake.store -> kvcake.compat.mooncake.store (the same module object)."""\n\n'
        "import sys\n\nfrom kvcake.compat.mooncake import store as _impl\n\n"
        "sys.modules[__name__] = _impl\n"
    ),
    "engine.py": (
        '"""mooncake.engine -> kvcake.compat.mooncake.engine (the same module object)."""\n\n'
        "import sys\n\nfrom kvcake.compat.mooncake import engine as _impl\n\n"
        "sys.modules[__name__] = _impl\n"
    ),
    "mooncake_config.py": (
        '"""mooncake.mooncake_config -> kvcake.compat.mooncake.mooncake_config."""\n\n'
        "import sys\n\nfrom kvcake.compat.mooncake import mooncake_config as _impl\n\n"
        "sys.modules[__name__] = _impl\n"
    ),
    "buffer_pool.py": (
        '"""mooncake.buffer_pool: the local-buffer pools (the wheel re-exports mooncake.store\'s)."""\n\n'
        "from kvcake.compat.mooncake._buffer_pool import BufferPool, RegisteredBufferPool\n\n"
        '__all__ = ["BufferPool", "RegisteredBufferPool"]\n'
    ),
    "http_metadata_server.py": (
        '"""mooncake.http_metadata_server -> kvcake.compat.mooncake.http_metadata_server."""\n\n'
        "import sys\n\nfrom kvcake.compat.mooncake import http_metadata_server as _impl\n\n"
        "sys.modules[__name__] = _impl\n"
    ),
    "_fast_copy.py": (
        '"""mooncake._fast_copy -> kvcake.compat.mooncake._fast_copy."""\n\n'
        "import sys\n\nfrom kvcake.compat.mooncake import _fast_copy as _impl\n\n"
        "sys.modules[__name__] = _impl\n"
    ),
    "structured_object_store.py": (
        '"""mooncake.structured_object_store -> kvcake.compat.mooncake.structured_object_store."""\n\n'
        "import sys\n\nfrom kvcake.compat.mooncake import structured_object_store as _impl\n\n"
        "sys.modules[__name__] = _impl\n"
    ),
    "async_store.py": (
        '"""mooncake.async_store -> kvcake.compat.mooncake.async_store."""\n\n'
        "import sys\n\nfrom kvcake.compat.mooncake import async_store as _impl\n\n"
        "sys.modules[__name__] = _impl\n"
    ),
    "dataproto_catalog.py": (
        '"""mooncake.dataproto_catalog -> kvcake.compat.mooncake.dataproto_catalog."""\n\n'
        "import sys\n\nfrom kvcake.compat.mooncake import dataproto_catalog as _impl\n\n"
        "sys.modules[__name__] = _impl\n"
    ),
    MARKER: "This mooncake package is kvcake's shim (kvcake mooncake-shim status).\n",
}


class ShimError(KvcakeError):
    pass


@dataclass(frozen=True)
class Found:
    path: Path
    is_shim: bool
    version: str = ""  # the real Mooncake's, when found for another interpreter

    def describe(self) -> str:
        if self.is_shim:
            return f"kvcake shim ({self.path})"
        return f"real Mooncake {self.version or mooncake_version()} ({self.path})"


# Run by another interpreter: where its `import mooncake` goes, its path, its wheel's version.
_PROBE = """
import importlib.util, json, sys
from importlib import metadata
spec = importlib.util.find_spec("mooncake")
version = ""
for dist in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
    try:
        version = metadata.version(dist)
        break
    except metadata.PackageNotFoundError:
        pass
print(json.dumps({"origin": spec.origin if spec else None, "path": sys.path, "version": version}))
"""


def imported_by(python: str) -> tuple[Found | None, list[Found]]:
    """Which ``mooncake`` the interpreter ``python`` imports, and every one on its path (the
    first is the one it picks); asked of that interpreter itself, in this directory."""

    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True,
                             text=True, timeout=60, check=True)  # fmt: skip
        info = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise ShimError(f"cannot ask {python} which mooncake it imports: {exc}") from exc
    every = [Found(f.path, f.is_shim, info["version"]) for f in found(info["path"])]
    if info["origin"] is None:
        return None, every
    pkg = Path(info["origin"]).parent
    return Found(pkg.resolve(), is_shim(pkg), info["version"]), every


def mooncake_version() -> str:
    for dist in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "(version unknown)"


def site_dir() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def is_shim(pkg: Path) -> bool:
    """The marker *and* our ``__init__`` (a real wheel installed over the shim replaces the
    latter and its extension modules take precedence over our ``store.py``)."""
    try:
        init = (pkg / "__init__.py").read_text(errors="replace")
    except OSError:
        return False
    return (pkg / MARKER).is_file() and "__kvcake_shim__" in init


def found(paths: list[str] | None = None) -> list[Found]:
    """Every ``mooncake`` package on the path, the one ``import mooncake`` picks first."""
    out = []
    for entry in paths if paths is not None else sys.path:
        pkg = Path(entry or ".") / "mooncake"
        if (pkg / "__init__.py").is_file():
            out.append(Found(pkg.resolve(), is_shim(pkg)))
    return out


def active() -> Found | None:
    spec = importlib.util.find_spec("mooncake")
    if spec is None or spec.origin is None:
        return None
    pkg = Path(spec.origin).parent
    return Found(pkg.resolve(), is_shim(pkg))


def install(target: Path | None = None) -> Path:
    """Write the shim into ``target`` (default: this interpreter's site-packages) and the
    programs into :func:`programs.scripts_dir` (``target/bin``, or this venv's scripts)."""

    bin_dir = programs.scripts_dir(target)
    target = target or site_dir()
    real = [f for f in found([*sys.path, str(target)]) if not f.is_shim]
    if real:
        raise ShimError(
            f"a real Mooncake is installed ({real[0].describe()}); the shim never shadows it. "
            "Use a venv without Mooncake, or `pip uninstall mooncake-transfer-engine-non-cuda`."
        )
    other = programs.foreign(bin_dir)
    if other:
        raise ShimError(
            f"{other[0].path} is not kvcake's (a real Mooncake's program?); the shim never "
            "writes over it. Remove it or install into a venv without Mooncake."
        )
    pkg = target / "mooncake"
    pkg.mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (pkg / name).write_text(text)
    programs.install(bin_dir)
    importlib.invalidate_caches()
    return pkg


def uninstall(target: Path | None = None) -> Path | None:
    """Remove the shim from ``target`` and kvcake's programs from its scripts dir; a real
    Mooncake there is left alone (ShimError), as are programs that are not kvcake's."""

    pkg = (target or site_dir()) / "mooncake"
    if pkg.exists() and not is_shim(pkg):
        raise ShimError(f"{pkg} is not kvcake's shim (a real Mooncake is there); not removing it")
    programs.uninstall(programs.scripts_dir(target))
    if not pkg.exists():
        return None
    shutil.rmtree(pkg)
    importlib.invalidate_caches()
    return pkg
