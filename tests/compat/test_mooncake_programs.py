"""Mooncake's programs as kvcake stand-ins (``mooncake_master``, ``mooncake_client``,
``transfer_engine_bench``), written by ``kvcake mooncake-shim install --target``: real processes
on free loopback ports, started through the installed scripts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvcake.compat.mooncake import programs, shim
from kvcake.compat.mooncake import te_bench_data as D
from kvcake.core.ports import free_port
from tests.waits import wait_until

KVCAKE = str(Path(sys.executable).parent / "kvcake")
MB = 1024 * 1024


class Prog:
    """A started script; its output lines are collected by reader threads."""

    def __init__(self, *argv: str, env: dict[str, str] | None = None):
        self.popen = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [
            threading.Thread(target=self._pump, args=(stream, lines), daemon=True)
            for stream, lines in ((self.popen.stdout, self.out), (self.popen.stderr, self.err))
        ]
        for r in self.readers:
            r.start()

    @staticmethod
    def _pump(stream: object, lines: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append(line)

    def wait_line(self, prefix: str, timeout: float = 60) -> dict[str, str]:
        """``key=value`` pairs of the first stdout line starting with ``prefix``."""

        def output() -> str:
            return "".join(self.out) + "".join(self.err)

        def found() -> dict[str, str] | None:
            exited = self.popen.poll() is not None
            if exited:
                self.done(5)  # the readers drain the rest
            line = next((x for x in list(self.out) if x.startswith(prefix)), None)
            if line is not None:
                return dict(re.findall(r"(\w+)=(\S*)", line))
            assert not exited, f"exited without a {prefix!r} line:\n{output()}"
            return None

        return wait_until(found, timeout=timeout, what=f"a {prefix!r} line", detail=output)

    def done(self, timeout: float) -> int:
        """Wait for the exit, then for the last output lines."""
        rc = self.popen.wait(timeout)
        for r in self.readers:
            r.join(5)
        return rc

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            return self.popen.wait(5)


@pytest.fixture
def started() -> Iterator[list[Prog]]:
    procs: list[Prog] = []
    yield procs
    for p in reversed(procs):
        p.stop()


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("shim")
    shim.install(target)
    return target / "bin"


def test_install_status_uninstall(tmp_path: Path) -> None:
    target = tmp_path / "site"
    pkg = shim.install(target)
    scripts = [target / "bin" / name for name in programs.PROGRAMS]
    assert all(p.is_file() and os.access(p, os.X_OK) and programs.is_ours(p) for p in scripts)
    assert scripts[0].read_text().startswith(f"#!{sys.executable}\n")
    status = subprocess.run(
        [KVCAKE, "mooncake-shim", "status", "--target", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    for name in programs.PROGRAMS:
        assert f"program {name}: kvcake ({target / 'bin' / name})" in status.stdout
    assert shim.uninstall(target) == pkg
    assert not any(p.exists() for p in scripts)
    # A program of the same name that is not kvcake's is never written over nor removed.
    foreign = target / "bin" / "mooncake_client"
    foreign.write_text("#!/bin/sh\necho real\n")
    with pytest.raises(shim.ShimError, match="not kvcake's"):
        shim.install(target)
    assert not (target / "mooncake").exists()
    assert shim.uninstall(target) is None and foreign.read_text().endswith("echo real\n")
    assert "NOT kvcake" in "\n".join(programs.status_lines(target / "bin"))


def test_master_and_client_hold_the_pool(bin_dir: Path, started: list[Prog]) -> None:
    from kvcake.compat.mooncake import MooncakeDistributedStore

    master = Prog(
        str(bin_dir / "mooncake_master"),  # Mooncake's ports: 0 would mean 50051 and 9003
        f"--rpc_port={free_port()}", f"--metrics_port={free_port()}", "--max_threads=2",
        "--client_ttl=2",
    )  # fmt: skip
    started.append(master)
    rpc = master.wait_line("master rpc=")["rpc"]
    port = free_port()
    client = Prog(
        str(bin_dir / "mooncake_client"),
        f"--master_server_address={rpc}", f"--port={port}", "--global_segment_size=32MB",
        "--local_buffer_size=16MB", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE",
        "--threads", "2",
    )  # fmt: skip
    started.append(client)
    info = client.wait_line("mooncake_client segment=")
    assert info["size"] == str(32 * MB)  # Mooncake's units: MB is 1024-based
    assert info["port"] == f"127.0.0.1:{port}"  # dummy clients attach there (as Mooncake's)
    with urllib.request.urlopen(f"http://{info['http']}/health", timeout=10) as r:
        assert r.status == 200
    assert any("--threads has no kvcake counterpart" in x for x in client.err)
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MB, "tcp", "", rpc) == 0
    try:
        value = np.random.default_rng(1).bytes(2 * MB)
        assert store.put("held-by-mooncake_client", value) == 0
        assert store.get("held-by-mooncake_client") == value
        assert client.stop() == 0  # the only segment leaves the pool, and the object with it
        assert store.get("held-by-mooncake_client") == b""
    finally:
        store.close()


def test_bad_flags_and_unreachable_master(bin_dir: Path, started: list[Prog]) -> None:
    dead = f"127.0.0.1:{free_port()}"
    cases = {  # gflags' own errors exit 1 in its words, as the wheel's programs; kvcake's 2
        "mooncake_client --master_server_adress=127.0.0.1:1": (
            1, "ERROR: unknown command line flag 'master_server_adress'"),
        "mooncake_client --port=x": (1, "ERROR: illegal value 'x' specified for int32 flag 'port'"),
        "mooncake_client --global_segment_size=lots": (2, "Invalid segment size"),
        "mooncake_client --protocol=rdma": (2, "kvcake has no rdma"),
        "transfer_engine_bench --blok_size=4096": (2, "did you mean --block_size"),
        "transfer_engine_bench --mode=initiator": (2, "--segment_id is required"),
        "mooncake_master --rpc_prot=1": (1, "ERROR: unknown command line flag 'rpc_prot'"),
    }  # fmt: skip
    runs = {cmd: Prog(str(bin_dir / cmd.split()[0]), *cmd.split()[1:]) for cmd in cases}
    started.extend(runs.values())
    t0 = time.monotonic()
    unreachable = Prog(
        str(bin_dir / "mooncake_client"), f"--master_server_address={dead}", f"--port={free_port()}",
        env={"KVCAKE_MOONCAKE_CLIENT_CONNECT_S": "2"},
    )  # fmt: skip
    started.append(unreachable)
    for cmd, (code, message) in cases.items():
        p = runs[cmd]
        assert p.done(120) == code, cmd
        assert message in "".join(p.err), (cmd, p.err)
    assert unreachable.done(60) == 1
    assert time.monotonic() - t0 < 60
    assert f"cannot reach the master at {dead} within 2 s" in "".join(unreachable.err)


def test_transfer_engine_bench_moves_bytes(bin_dir: Path, started: list[Prog]) -> None:
    bench = str(bin_dir / "transfer_engine_bench")
    size = 4 * MB
    # As Mooncake's, the buffer grows to block x batch x threads: the target gets them too.
    flags = ["--block_size=16384", "--batch_size=16", "--threads=2", "--duration=1"]
    span = 16384 * 16 * 2
    target = Prog(bench, "--mode=target", "--protocol=tcp", f"--buffer_size={size}", *flags)
    started.append(target)
    info = target.wait_line("transfer_engine_bench target")
    segment = info["segment"]
    assert info["buffer"] == str(size)
    for op in ("read", "write"):
        run = subprocess.run(
            [bench, "--mode=initiator", f"--segment_id={segment}", f"--operation={op}",
             "--metadata_server=P2PHANDSHAKE", "--report_unit=MB", f"--buffer_size={size}", *flags],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        report = re.search(
            r"\] Test completed: duration ([\d.]+), batch count (\d+), throughput ([\d.]+) MB/s",
            run.stderr,
        )
        assert report is not None, run.stderr
        assert float(report[1]) >= 1.0 and int(report[2]) > 0 and float(report[3]) > 0
        assert f"verified={span} operation={op}" in run.stdout
    assert target.stop() == 0
    crc = target.wait_line("transfer_engine_bench target crc32=")["crc32"]
    want = np.zeros(size, dtype=np.uint8)
    D.fill(want, D.TARGET_SEED)
    want[:span] = D.pattern(0, span, D.WRITE_SEED)  # what the write run left in the target
    assert int(crc, 16) == D.crc32(want)
