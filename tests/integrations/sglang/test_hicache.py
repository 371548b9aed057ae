"""SGLang 0.5.23's HiCache storage on kvcake, with SGLang's real classes (factory, CPU pools).

Each worker is a process of the SGLang venv (``make install-sglang``) running
``sglang_worker.py`` against a kvcake master and store-server started here: worker A
``batch_set_v1`` 4 pages, worker B ``batch_exists`` + ``batch_get_v1`` into other host slots,
pages equal. Once through kvcake's backend (``dynamic``), per host layout; once through
SGLang's own ``MooncakeStore`` over kvcake's Mooncake shim. A missing venv fails the test and
names the make target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.store import procs

REPO = Path(__file__).resolve().parents[3]
SGL_PY = REPO / ".venv-sglang" / "bin" / "python"
WORKER = Path(__file__).with_name("sglang_worker.py")
TIMEOUT_S = 120


def _python() -> Path:
    if not (SGL_PY.exists() and (REPO / ".venv-sglang" / ".installed-sglang").exists()):
        pytest.fail(f"the SGLang venv is missing ({SGL_PY}): run 'make install-sglang'")
    return SGL_PY


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    with procs.pool("64MiB") as addr:
        yield addr


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
    env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env


def _result(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, out[-3000:]
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def _pair(kind: str, addr: str, cases: str, env: dict[str, str]) -> tuple[dict, dict]:
    """Worker A writes every case and stays up (a Mooncake client's pages live in its segment)
    until worker B has read them."""
    args = [kind, addr, "11", cases]
    writer = subprocess.Popen([str(_python()), str(WORKER), "write", *args], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdin is not None
        seen = []
        for line in writer.stdout:
            seen.append(line)
            if line.strip() == "written":
                break
        assert seen and seen[-1].strip() == "written", "".join(seen)[-3000:]
        reader = subprocess.run([str(_python()), str(WORKER), "read", *args], env=env,
                                capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
        writer.stdin.write("done\n")
        writer.stdin.flush()
        rest, _ = writer.communicate(timeout=TIMEOUT_S)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(10)
    return _result("".join(seen) + rest), _result(reader.stdout + reader.stderr)


@pytest.fixture(scope="module")
def kvcake_runs(master: str) -> tuple[dict, dict]:
    """kvcake's backend: MHA page_first, MHA layer_first, MLA page_first, and the bad calls
    (in the reader), in one writer and one reader process."""
    return _pair("kvcake", master, "page_first,layer_first,page_first+mla,misuse", _env())


def _shared(wrote: dict, read: dict) -> None:
    assert wrote["set"] == [True] * 4
    assert read["exists"] == 4  # 4 pages of this prompt, none of the other
    assert read["get"] == [True] * 4
    assert read["get_missing"] == [False] * 4  # a list, never None; no bytes written
    assert read["equal"] and read["nonzero"]


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_kvcake_backend_two_workers_share_pages(
    kvcake_runs: tuple[dict, dict], layout: str
) -> None:
    _shared(kvcake_runs[0][layout], kvcake_runs[1][layout])


def test_kvcake_backend_mla_pages_are_shared_by_tp_ranks(kvcake_runs: tuple[dict, dict]) -> None:
    """MLA (keys only): TP rank 0 writes, rank 1 of the same model reads the same objects."""
    _shared(kvcake_runs[0]["page_first+mla"], kvcake_runs[1]["page_first+mla"])


def test_kvcake_backend_refuses_bad_calls(kvcake_runs: tuple[dict, dict]) -> None:
    res = kvcake_runs[1]["misuse"]
    for call in ("set_short", "get_short", "get_out_of_pool"):
        assert res[call] == [False] * 4, call
    assert res["untouched"]
    layout_err, mla_err = res["refused"]
    assert "layout 'head_first_unknown' is not supported" in layout_err
    assert "is_mla_model=True" in mla_err
    assert res["v0_set"] and res["v0_get"] and res["v0_wrong_size"] is None
    assert res["v0_exists"] == [True, False]
    assert res["layer_first_sees"] == 0  # page_first bytes are never read as layer_first


def test_sglang_mooncake_store_over_the_shim(master: str, tmp_path: Path) -> None:
    shim = tmp_path / "shim"
    got = subprocess.run([sys.executable, "-m", "kvcake", "mooncake-shim", "install", "--target",
                          str(shim)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert got.returncode == 0, got.stderr
    env = _env({
        "PYTHONPATH": str(shim), "MOONCAKE_MASTER": master, "MOONCAKE_PROTOCOL": "tcp",
        "MOONCAKE_TE_META_DATA_SERVER": "P2PHANDSHAKE",
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(32 << 20),
        "LOCAL_HOSTNAME": "127.0.0.1", "SGLANG_HOST_IP": "127.0.0.1",
    })  # fmt: skip
    wrote, read = _pair("mooncake", master, "page_first", env)
    _shared(wrote["page_first"], read["page_first"])
