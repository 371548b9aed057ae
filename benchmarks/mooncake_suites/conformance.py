"""Mooncake's own Python suites, unedited, as Mooncake's users run them: against kvcake through
the switch and against the real wheel, side by side (issue 36; docs/compat/mooncake.md).

kvcake's side: ``kvcake mooncake-shim install --target SCRATCH`` (the thin ``mooncake`` package
and the stand-in programs), the stand-in ``SCRATCH/bin/mooncake_master`` started with the
command line of Mooncake's scripts (``--rpc_port=P --enable_http_metadata_server=true
--http_metadata_server_host=127.0.0.1 --http_metadata_server_port=M --metrics_port=X
--default_kv_lease_ttl=...``, free loopback ports), the suite run by kvcake's Python with
``PYTHONPATH=SCRATCH``. The wheel's side: its venv's ``mooncake_master`` with the same command
line (plus ``--rpc_address=127.0.0.1 --metrics_host=127.0.0.1``: loopback only) and its Python.
Each suite runs under pytest (unittest suites too, so a failfast suite still runs every test);
the per-test outcomes of both sides are compared and every test whose outcome differs listed.

The suites are not in this repository: point ``--mooncake-src`` (or ``KVCAKE_MOONCAKE_SRC``) at
a Mooncake checkout (its ``mooncake-wheel/tests`` and ``scripts``) or a directory of suite files.

    python benchmarks/mooncake_suites/conformance.py --mooncake-src ~/Mooncake \\
        [--wheel-python /path/venv/bin/python] [--out DIR] [test_put_get_tensor.py ...]
        [--env K=V ...] [--master-arg=--flag=value ...]   # what a suite's docstring asks for
It exits 1 when a test passes on the wheel and not on kvcake (the goal is none); tests that
pass on kvcake and fail on the wheel are listed but do not count against it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))
from kvcake.core.ports import free_port  # noqa: E402

LEASE_MS = 1000
SUITE_TIMEOUT_S = 900
# Suites that need no master (they start their own, or none).
# The wheel's master listens on every interface by default: keep it on loopback.
WHEEL_LOOPBACK = ["--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1"]
NO_MASTER = {
    "test_mooncake_config.py", "test_fast_copy.py", "test_cli.py",
    "test_http_metadata_server.py", "test_http_metadata_server_startup.py",
}  # fmt: skip


def suites(src: Path, names: list[str]) -> list[Path]:
    dirs = [src / "mooncake-wheel" / "tests", src / "scripts", src]
    found: dict[str, Path] = {}
    for d in dirs:
        for p in sorted(d.glob("test_*.py")) if d.is_dir() else []:
            found.setdefault(p.name, p)
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise SystemExit(f"not found under {src}: {', '.join(missing)}")
        return [found[n] for n in names]
    return list(found.values())


def per_side(values: list[str], side: str, out: Path) -> list[str]:
    """``{side}`` and ``{out}`` in a --master-arg or --env value: e.g. a ``--root_fs_dir`` of
    each side's own, so the wheel's offloaded files are not what kvcake's side reads."""
    return [v.replace("{side}", side).replace("{out}", str(out)) for v in values]


def master_flags(rpc: int, meta: int, metrics: int) -> list[str]:
    """The command line of Mooncake's scripts, on free ports."""
    return [
        f"--rpc_port={rpc}", "--enable_http_metadata_server=true",
        "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={meta}",
        f"--metrics_port={metrics}", f"--default_kv_lease_ttl={LEASE_MS}",
    ]  # fmt: skip


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"mooncake_master exited ({proc.returncode})")
        time.sleep(0.1)
    raise RuntimeError(f"mooncake_master did not listen on {port} in {timeout} s")


@contextlib.contextmanager
def master(program: Path, extra: list[str], log: Path) -> Iterator[dict[str, str]]:
    rpc, meta, metrics = free_port(), free_port(), free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([str(program), *master_flags(rpc, meta, metrics), *extra],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            _wait_port(rpc, proc)
            _wait_port(meta, proc)
            yield {
                "MASTER_SERVER": f"127.0.0.1:{rpc}", "MOONCAKE_MASTER": f"127.0.0.1:{rpc}",
                "MC_METADATA_SERVER": f"http://127.0.0.1:{meta}/metadata",
                "DEFAULT_KV_LEASE_TTL": str(LEASE_MS), "PROTOCOL": "tcp", "DEVICE_NAME": "",
            }  # fmt: skip
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def outcomes(xml: Path) -> dict[str, str]:
    """test id -> passed / failed / error / skipped, from pytest's junit XML."""
    if not xml.is_file():
        return {}
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}"
        kinds = [child.tag for child in case]
        out[name] = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        out[name] = out[name].replace("failure", "failed")
    return out


def run_side(side: str, suite: Path, python: str, bin_dir: Path, env: dict[str, str],
             out: Path, extra: list[str]) -> dict[str, str]:  # fmt: skip
    extra = per_side(extra, side, out)
    env = dict(e.split("=", 1) for e in per_side([f"{k}={v}" for k, v in env.items()], side, out))
    xml = out / f"{suite.stem}.{side}.xml"
    log = out / f"{suite.stem}.{side}.log"
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           suite.name]  # fmt: skip
    with contextlib.ExitStack() as stack:
        if suite.name not in NO_MASTER:
            env = {**env, **stack.enter_context(
                master(bin_dir / "mooncake_master", extra, out / f"{suite.stem}.{side}.master.log"))}  # fmt: skip
        with log.open("wb") as f:
            try:
                subprocess.run(cmd, cwd=suite.parent, env={**os.environ, **env}, stdout=f,
                               stderr=subprocess.STDOUT, timeout=SUITE_TIMEOUT_S)  # fmt: skip
            except subprocess.TimeoutExpired:
                f.write(b"\nconformance: timed out\n")
    return outcomes(xml)


def count(res: dict[str, str]) -> str:
    if not res:
        return "no result (collection error or timeout: see the log)"
    kinds = ("passed", "failed", "error", "skipped")
    return ", ".join(f"{sum(v == k for v in res.values())} {k}" for k in kinds if k in res.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suites", nargs="*", help="suite file names (default: every test_*.py)")
    ap.add_argument("--mooncake-src", default=os.environ.get("KVCAKE_MOONCAKE_SRC"))
    ap.add_argument("--wheel-python", default=os.environ.get("KVCAKE_MOONCAKE_PYTHON"))
    ap.add_argument("--kvcake-python", default=sys.executable)
    ap.add_argument("--out", default=None, help="logs and junit files (default: a temp dir)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="more environment for both sides' suites (e.g. MC_LEGACY_RPC_PORT_BINDING=1)")  # fmt: skip
    ap.add_argument("--master-arg", action="append", default=[], metavar="FLAG",
                    help="one more flag for both sides' mooncake_master, as a suite's docstring "
                    "asks (e.g. --master-arg=--enable_offload=true); {side} and {out} expand")  # fmt: skip
    a = ap.parse_args()
    if not a.mooncake_src:
        ap.error("give --mooncake-src or KVCAKE_MOONCAKE_SRC (a Mooncake checkout)")
    out = Path(a.out or tempfile.mkdtemp(prefix="mooncake-conformance-"))
    out.mkdir(parents=True, exist_ok=True)
    if bad := [e for e in a.env if "=" not in e]:
        ap.error(f"--env takes K=V: {bad}")
    extra_env = dict(e.split("=", 1) for e in a.env)
    scratch = out / "shim"
    kvcake = Path(a.kvcake_python).parent / "kvcake"
    if not (scratch / "mooncake").is_dir():
        subprocess.run([str(kvcake), "mooncake-shim", "--target", str(scratch), "install"],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    print("| suite | wheel | kvcake | tests whose outcome differs |\n|---|---|---|---|")
    regressions = []
    for suite in suites(Path(a.mooncake_src), a.suites):
        line, lost = compare(suite, a, scratch, out, extra_env)
        print(line, flush=True)
        regressions += lost
    print(f"\nlogs: {out}")
    if regressions:  # the goal: every test the wheel passes passes on kvcake
        print(f"{len(regressions)} tests pass on the wheel and not on kvcake: {regressions}")
    return 1 if regressions else 0


def compare(suite: Path, a: argparse.Namespace, scratch: Path, out: Path,
            extra_env: dict[str, str]) -> tuple[str, list[str]]:  # fmt: skip
    """One suite on both sides: its table row, and the tests only the wheel passes."""
    ours = run_side("kvcake", suite, a.kvcake_python, scratch / "bin",
                    {**extra_env, "PYTHONPATH": str(scratch)}, out, a.master_arg)  # fmt: skip
    theirs: dict[str, str] = {}
    if a.wheel_python:
        theirs = run_side("wheel", suite, a.wheel_python, Path(a.wheel_python).parent,
                          extra_env, out, [*WHEEL_LOOPBACK, *a.master_arg])  # fmt: skip
    diff = sorted(t for t in set(ours) | set(theirs) if a.wheel_python
                  and ours.get(t) != theirs.get(t))  # fmt: skip
    shown = "; ".join(f"{t}: wheel {theirs.get(t)}, kvcake {ours.get(t)}" for t in diff)
    lost = [t for t in diff if theirs.get(t) == "passed"]
    line = (f"| {suite.name} | {count(theirs) if a.wheel_python else '-'} | {count(ours)} | "
            f"{shown or '-'} |")  # fmt: skip
    return line, lost


if __name__ == "__main__":
    sys.exit(main())
