"""Start the real ``mooncake_master`` of the wheel's venv on loopback (tests only)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from kvcake.core.ports import free_port


@contextlib.contextmanager
def mooncake_master(bin_dir: Path, *flags: str) -> Iterator[str]:
    port = free_port()
    cmd = [
        str(bin_dir / "mooncake_master"), f"--rpc_port={port}", "--rpc_address=127.0.0.1",
        "--metrics_port=0", "--metrics_host=127.0.0.1", *flags,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited ({proc.returncode})")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
