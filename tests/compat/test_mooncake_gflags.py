"""gflags' syntax and errors as the stand-in programs parse them (pure parsing: unit tests), and
the stand-in ``mooncake_master`` started with the command line of Mooncake's own scripts
(distinct metadata and metrics ports, both served), compared with the wheel's program when
``KVCAKE_MOONCAKE_PYTHON`` names its venv."""

from __future__ import annotations

import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from kvcake.compat.mooncake import gflags, master_program
from kvcake.compat.mooncake.flag_catalog import CLIENT, MASTER
from kvcake.core.ports import free_port
from tests.compat.test_mooncake_programs import Prog, bin_dir, started

__all__ = ["bin_dir", "started"]  # fixtures

FLAGS = master_program.catalog()


def parse(*argv: str, env: dict[str, str] | None = None) -> gflags.Parsed:
    return gflags.parse(FLAGS, list(argv), env=env or {})


def error(*argv: str) -> str:
    with pytest.raises(gflags.GFlagsExit) as info:
        parse(*argv)
    assert info.value.code == 1
    return info.value.message


def test_forms_of_a_flag(tmp_path: Path) -> None:
    p = parse("--rpc_port=1", "-metrics_port", "2", "--enable_ha", "--nooffload_on_evict",
              "pos", "--client_ttl", "0x10", "--eviction_ratio=.5", "--", "--not_a_flag")  # fmt: skip
    assert p.values == {"rpc_port": "1", "metrics_port": "2", "enable_ha": "true",
                        "offload_on_evict": "false", "client_ttl": "16",
                        "eviction_ratio": "0.5"}  # fmt: skip
    assert p.rest == ["pos", "--not_a_flag"]  # a bool never takes the next argument
    assert parse("--enable_ha=no", "--enable_ha=Yes").values["enable_ha"] == "true"  # last wins
    flagfile = tmp_path / "master.flags"
    flagfile.write_text("# Mooncake's flags\n--rpc_port=7\n--logtostderr\n\n-root_fs_dir=/x y\n")
    p = parse(f"--flagfile={flagfile}", "--rpc_port=8")
    assert p.values["rpc_port"] == "8" and p.values["root_fs_dir"] == "/x y"
    assert p.values["logtostderr"] == "true"
    env = {"FLAGS_rpc_port": "9"}
    assert parse("--fromenv=rpc_port", env=env).values["rpc_port"] == "9"
    assert "rpc_port" not in parse("--tryfromenv=rpc_port").values
    lenient = parse("--undefok=newer_flag", "--newer_flag=1", "--nonewer_flag", "--v=1")
    assert lenient.values == {"undefok": "newer_flag", "v": "1"}  # accepted, not kept


def test_gflags_errors() -> None:
    assert error("--bogus=1") == "ERROR: unknown command line flag 'bogus'"
    assert error("--nobogus") == "ERROR: unknown command line flag 'nobogus'"
    assert (
        error("--rpc_port=abc") == "ERROR: illegal value 'abc' specified for int32 flag 'rpc_port'"
    )
    assert (
        error("--norpc_port")
        == "ERROR: boolean value (norpc_port) specified for int32 command line flag"
    )
    assert (
        error("--enable_ha=maybe")
        == "ERROR: illegal value 'maybe' specified for bool flag 'enable_ha'"
    )
    assert error("--rpc_port").startswith("ERROR: flag '--rpc_port' is missing its argument")
    assert error("--rpc_port=4294967296").startswith("ERROR: illegal value '4294967296'")
    assert error("--put_start_discard_timeout_sec=-1").endswith(
        "uint64 flag 'put_start_discard_timeout_sec'"
    )
    assert error("--flagfile=/nonexistent/f") == "/nonexistent/f: No such file or directory"
    assert error("--fromenv=rpc_port") == "ERROR: FLAGS_rpc_port not found in environment"
    assert error("--fromenv=bogus").startswith("ERROR: unknown command line flag 'bogus'")  # fmt: skip


def test_every_flag_of_the_wheel_is_known() -> None:
    """The catalog is the wheel's --help list: 99 master flags, 16 client flags, 35 common."""
    assert len(gflags.table(MASTER)) == 99 and len(gflags.table(CLIENT)) == 16
    assert {"rpc_port", "enable_http_metadata_server", "http_metadata_server_host", "metrics_port",
            "logtostderr", "v", "flagfile", "help", "enable_snapshot"} <= set(FLAGS)  # fmt: skip


def _urlopen(url: str, data: bytes | None = None, method: str = "GET") -> bytes:
    req = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        return bytes(r.read())


def test_master_with_mooncakes_script_command_line(bin_dir: Path, started: list[Prog]) -> None:
    rpc, meta, metrics = free_port(), free_port(), free_port()
    master = Prog(
        str(bin_dir / "mooncake_master"), f"--rpc_port={rpc}", "--enable_http_metadata_server=true",
        "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={meta}",
        f"--metrics_port={metrics}", "--default_kv_lease_ttl", "500", "--logtostderr",
        "--eviction_high_watermark_ratio=0.95", "--rpc_thread_num=4", "--v=0",
    )  # fmt: skip
    started.append(master)
    info = master.wait_line("master rpc=")
    assert (info["rpc"], info["http"]) == (f"127.0.0.1:{rpc}", f"127.0.0.1:{metrics}")
    assert info["metadata"] == f"127.0.0.1:{meta}"
    url = f"http://127.0.0.1:{meta}/metadata?key=mooncake/rpc_meta/a"
    _urlopen(url, b'{"ip":"127.0.0.1"}', "PUT")
    assert _urlopen(url) == b'{"ip":"127.0.0.1"}'
    assert b"kvcake_store_master" in _urlopen(f"http://127.0.0.1:{metrics}/metrics")
    assert master.stop() == 0


def test_help_and_unknown_flags_like_the_wheel(bin_dir: Path) -> None:
    ours = subprocess.run([str(bin_dir / "mooncake_master"), "--help"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert ours.returncode == 1  # as gflags: --help exits 1
    for name in ("-rpc_port", "-http_metadata_server_port", "-enable_snapshot", "-logtostderr"):
        assert f"    {name} (" in ours.stdout
    wheel = os.environ.get("KVCAKE_MOONCAKE_PYTHON")
    cases = ["--bogus=1", "--rpc_port=abc", "--norpc_port", "--enable_ha=maybe"]
    for prog in ("mooncake_master", "mooncake_client"):
        for argv in cases:
            run = subprocess.run([str(bin_dir / prog), argv], capture_output=True, text=True,
                                 timeout=60)  # fmt: skip
            assert run.returncode == 1, (prog, argv, run.stderr)
            if wheel:
                real = subprocess.run([str(Path(wheel).parent / prog), argv],
                                      capture_output=True, text=True, timeout=60)  # fmt: skip
                assert (real.returncode, real.stderr.strip()) == (1, run.stderr.strip())
