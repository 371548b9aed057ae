"""Two LMCache engines (separate processes) share chunks through kvcake as LMCache's remote
storage (``remote_storage_plugins``), byte for byte; an engine expecting another layout gets
misses with counted errors; a torn chunk is refused. And LMCache's own ``mooncakestore``
connector over kvcake's Mooncake shim. The engines run in the LMCache venv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integrations.lmcache.conftest import run_json
from tests.store.procs import Proc


def test_two_engines_share_chunks_through_kvcake(lmc_python: Path, pool: tuple[Proc, Proc]) -> None:
    master = pool[0].info["rpc"]
    wrote = run_json(lmc_python, "engine_proc.py", master, "store")
    assert wrote["stored"] is True and wrote["chunks"] == 5, wrote  # 4 full chunks + 1 partial
    read = run_json(lmc_python, "engine_proc.py", master, "load")
    reader, other = read["reader"], read["other"]
    assert isinstance(reader, dict) and isinstance(other, dict)
    # The reader's L1 is empty (a new process): every token came from kvcake, bytes equal.
    assert reader["tokens"] == 72 and reader["digest"] == wrote["digest"], reader
    assert reader["errors"] == {"layout_mismatch": 0, "store_error": 0, "bad_put": 0}
    # Same keys, one more layer: a miss with an error per chunk looked up, never a reshape.
    assert other["tokens"] == 0, other
    assert other["errors"]["layout_mismatch"] >= 1, other
    # A chunk someone stored as float16 under a bfloat16 key: a counted miss.
    assert reader["foreign_miss"] is True
    # A MemoryObj whose buffer is shorter than its shape says: an error, nothing stored.
    assert "its shapes/dtypes make" in str(reader["bad_put_error"])
    assert reader["bad_put_stored"] is False


def test_lmcache_mooncakestore_connector_over_the_shim(
    lmc_python: Path, pool: tuple[Proc, Proc], tmp_path: Path
) -> None:
    shim = tmp_path / "shim"
    subprocess.run([sys.executable, "-m", "kvcake", "mooncake-shim", "install", "--target",
                    str(shim)], check=True, capture_output=True, timeout=120)  # fmt: skip
    env = {"BACKEND": "mooncakestore", "PYTHONPATH": str(shim)}
    probe = subprocess.run([str(lmc_python), "-c", "import mooncake.store as s; print(s.__kvcake__)"],
                           env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert probe.stdout.strip() == "True", probe  # LMCache's `import mooncake` finds the shim
    master = pool[0].info["rpc"]
    wrote = run_json(lmc_python, "engine_proc.py", master, "store", env=env)
    assert wrote["stored"] is True and wrote["chunks"] == 5, wrote
    reader = run_json(lmc_python, "engine_proc.py", master, "load", env=env)["reader"]
    assert isinstance(reader, dict)
    assert reader["tokens"] == 72 and reader["digest"] == wrote["digest"], reader


def test_native_l2_plugin_under_lmcaches_mp_adapter(
    lmc_python: Path, pool: tuple[Proc, Proc]
) -> None:
    """kvcake's ``native_plugin`` for ``lmcache server``, driven by LMCache's own
    NativeConnectorL2Adapter: one adapter stores, another looks up and loads the same bytes;
    a buffer of another size is a failed load, counted, and left untouched."""
    got = run_json(lmc_python, "l2_proc.py", pool[0].info["rpc"])
    assert got["stored"] is True, got
    assert got["found"] == [True, True, False] and got["loaded"] == [True, True, False], got
    assert got["equal"] == [True, True], got
    assert got["misfit_loaded"] is False and got["misfit_untouched"] is True, got
    assert got["errors"] == {
        "size_mismatch": 1,
        "store_error": 0,
        "queue_full": 0,
        "internal": 0,
    }, got
