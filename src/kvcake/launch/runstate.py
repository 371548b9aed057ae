"""A running cluster's record on disk (``<run_dir>/latest.json``, written by the launcher) and
how to tell that a recorded pid is still the process that was started (its start time)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def proc_start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 if it is gone or a zombie: an
    exited process whose parent has not reaped it): with the pid, it identifies a process
    across pid reuse."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return 0 if fields[0] == "Z" else int(fields[19])


def pid_is(pid: int, ticks: int) -> bool:
    """True if ``pid`` is still the process that started at ``ticks``."""
    return ticks != 0 and proc_start_ticks(pid) == ticks


def write_state(
    paths: list[Path], url: str, run_dir: Path, processes: dict[str, Any], **extra: Any
) -> None:
    """The record `kvcake status` / `down` read, with this process as the supervisor; written
    atomically (temp file + rename) so readers never see half a file."""

    doc = {"supervisor_pid": os.getpid(), "supervisor_start_ticks": proc_start_ticks(os.getpid()),
           "url": url, "run_dir": str(run_dir), "processes": processes, **extra}  # fmt: skip
    text = json.dumps(doc, indent=2)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def live_cluster(run_dir: str | Path) -> dict[str, Any] | None:
    """The state of the cluster whose supervisor still runs in ``run_dir`` (``latest.json``)."""
    p = Path(run_dir) / "latest.json"
    try:
        doc: dict[str, Any] = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    pid, ticks = int(doc.get("supervisor_pid", 0)), int(doc.get("supervisor_start_ticks", 0))
    return doc if pid and pid_is(pid, ticks) else None
