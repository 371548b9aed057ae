"""``kvcake up`` fails fast and clearly on bad setups; the replay generator against a cluster."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvcake.core.errors import ConfigError
from kvcake.core.ports import free_ports
from kvcake.core.trace import TraceRecord
from kvcake.launch.launcher import Cluster, toml_dump
from kvcake.replay.runner import ReplayOptions, run_replay
from tests.cluster import make_cluster
from tests.waits import wait_until


def test_port_conflict_fails_fast(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        c = make_cluster(tmp_path, cluster={"proxy_port": port})
        with pytest.raises(ConfigError, match=r"cluster.proxy_port"):
            c.start()
        assert c.children == []  # nothing was left running


def test_instance_port_conflict_reports_the_setting(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "kvcake", "decode", "--backend", "emulated", "--port",
             str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "instance.port" in r.stderr


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[cluster]\nprefill = 0\n[instance]\nbackend = "gpu"\n')
    r = subprocess.run([sys.executable, "-m", "kvcake", "up", "--config", str(bad)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "kvcake: error:" in r.stderr
    assert "cluster.prefill" in r.stderr or "instance.backend" in r.stderr


def test_toml_dump_round_trips(tmp_path: Path) -> None:
    from kvcake.launch.launcher import load_serve_file

    conf = load_serve_file(
        None, {"proxy": {"prefill": ("http://a:1",)}, "conductor": {"ttft_slo_s": 2.5, "seed": 4}}
    )
    p = tmp_path / "c.toml"
    p.write_text(toml_dump({"kv": conf.kv, "cluster": conf.cluster, "proxy": conf.proxy}))
    again = load_serve_file(p)
    assert again.proxy == conf.proxy and again.cluster == conf.cluster


def test_replay_against_cluster(emulated_cluster: Cluster) -> None:
    recs = [
        TraceRecord(0.0, 1024, 4, (1, 2)),
        TraceRecord(1500.0, 1536, 3, (1, 2, 3)),  # shares 2 blocks with the first
        TraceRecord(1600.0, 9000, 2, tuple(range(100, 118))),  # beyond the context: dropped
    ]
    opts = ReplayOptions(url=emulated_cluster.url, tokens_per_block=32, max_context=512)
    s = asyncio.run(run_replay(recs, opts))
    assert (s.requests, s.completed, s.dropped, s.errors) == (3, 2, 1, 0)
    first, second = s.per_request[:2]
    assert (first.prompt_tokens, second.prompt_tokens) == (64, 96)
    assert second.cached_tokens == 64 and first.output_tokens == 4
    assert s.ttft_p50 > 0 and 0 < s.effective_capacity <= 1


def test_compare_sim_predicts_the_same_cluster() -> None:
    from kvcake.core.trace import read_trace
    from kvcake.data import sample_trace_path
    from kvcake.launch.launcher import load_serve_file
    from kvcake.replay.compare_sim import simulate_like
    from kvcake.replay.runner import prepare, summarize
    from kvcake.serve.config import default_cluster_file

    conf = load_serve_file(default_cluster_file().with_name("emulated.toml"))
    recs = read_trace(sample_trace_path(), limit=30)
    opts = ReplayOptions(url="http://unused", max_context=65536, max_output=32)
    reqs, _ = prepare(recs, opts)
    dropped = sum(r.status == "dropped" for r in reqs)
    pred = simulate_like(recs, summarize(reqs, 1.0, opts), conf, opts)
    assert pred["completed"] + pred["rejected"] == len(recs) - dropped
    assert 0 < pred["ttft_p50"] < 60 and 0 < pred["tbt_p50"] < 1


def test_up_detach_status_down(tmp_path: Path) -> None:
    """The background cycle a user runs: `up --detach`, `status`, `down`; every process ends."""
    run_dir = tmp_path / "runs"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[kv]\nmodel = "emulated-llama3-70b"\nkv_block_tokens = 32\n'
        f'[cluster]\nproxy_port = 0\nstore_servers = 0\nrun_dir = "{run_dir}"\n'
        '[instance]\nbackend = "emulated"\nkv_blocks = 64\nthreads = 1\n'
    )
    kv = [sys.executable, "-m", "kvcake"]
    up = subprocess.run([*kv, "up", "--config", str(cfg), "--detach"], capture_output=True,
                        text=True, timeout=300)  # fmt: skip
    state = run_dir / "latest.json"
    try:
        assert up.returncode == 0, up.stderr
        assert "cluster up: http://127.0.0.1:" in up.stdout
        doc = json.loads(state.read_text())
        pids = [int(p["pid"]) for p in doc["processes"].values()]
        st = subprocess.run([*kv, "status", "--config", str(cfg)], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
        assert st.returncode == 0 and "prefill" in st.stdout and "decode" in st.stdout, st.stdout
        assert "restarts 0" in st.stdout and "directory=127.0.0.1:" in st.stdout, st.stdout
        # A second `up` on the same run dir refuses and leaves the running cluster alone.
        again = subprocess.run([*kv, "up", "--config", str(cfg), "--detach"],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        assert again.returncode == 2 and "already running" in again.stderr, again.stderr
        assert json.loads(state.read_text())["supervisor_pid"] == doc["supervisor_pid"]
        assert all(Path(f"/proc/{p}").exists() for p in pids)
        assert httpx.get(doc["url"] + "/health", timeout=10).status_code == 200
    finally:
        down = subprocess.run([*kv, "down", "--config", str(cfg)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert down.returncode == 0 and not state.exists()
    wait_until(lambda: not [p for p in pids if Path(f"/proc/{p}").exists()], timeout=20,
               every_s=0.2, what="every cluster process gone")  # fmt: skip
    none = subprocess.run([*kv, "status", "--run-dir", str(run_dir)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert none.returncode == 1 and "no cluster running" in none.stdout


def test_down_never_signals_a_reused_pid(tmp_path: Path) -> None:
    """A stale record whose pids now belong to other processes: `down` leaves them alone."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        doc = {"supervisor_pid": bystander.pid, "supervisor_start_ticks": 1, "url": "http://x",
               "run_dir": str(tmp_path), "processes": {"proxy": {"pid": bystander.pid,
                                                                   "start_ticks": 1}}}  # fmt: skip
        (tmp_path / "latest.json").write_text(json.dumps(doc))
        r = subprocess.run([sys.executable, "-m", "kvcake", "down", "--run-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        assert r.returncode == 0 and "not signalled" in r.stdout, r.stdout
        time.sleep(0.3)
        assert bystander.poll() is None  # still running
    finally:
        bystander.kill()
        bystander.wait()


def test_supervisor_restarts_killed_children_on_their_ports(tmp_path: Path) -> None:
    """SIGKILL an instance and the proxy: each is restarted on its old port (the exit signal is
    recorded) and the cluster serves again at the same URL."""
    from kvcake.launch.supervisor import RestartPolicy, Supervisor

    # With a store master: its directory releases a dead owner's segment names.
    c = make_cluster(tmp_path, cluster={"prefill": 1, "decode": 1, "store_servers": 1,
                                        "store_size": "32MB"})  # fmt: skip
    c.supervisor = Supervisor(c, RestartPolicy(base_s=0.2))
    body = {"prompt": [300] * 40, "max_tokens": 2}
    with c:
        for name in ("decode-0", "proxy"):
            ch = c.child(name)
            old_pid = ch.proc.pid  # type: ignore[union-attr]
            ch.proc.kill()  # type: ignore[union-attr]
            wait_until(
                lambda ch=ch: httpx.post(c.url + "/v1/completions", json=body, timeout=10)
                .status_code == 200 and ch.restarts == 1,
                timeout=90, every_s=0.3, ignore=(httpx.HTTPError,), what=f"{name} restarted, serving",
                detail=lambda ch=ch: (ch.last_exit, ch.log.read_text()[-2000:]),
            )  # fmt: skip
            assert ch.proc.pid != old_pid and ch.last_exit == "killed by SIGKILL"  # type: ignore[union-attr]
        state = json.loads((c.run_dir / "cluster.json").read_text())
        assert state["processes"]["decode-0"]["restarts"] == 1
        assert state["processes"]["proxy"]["last_exit"] == "killed by SIGKILL"
    from kvcake.transfer import cleanup_stale

    cleanup_stale()


def _copy_tree(dst: Path) -> Path:
    """The working tree's tracked and new files (no .venv, no build output) — pip builds there,
    not in the shared clone."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout.split("\n")  # fmt: skip
    for rel in filter(None, out):
        src = root / rel
        if src.is_file() or src.is_symlink():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                (dst / rel).symlink_to(src.readlink())
            else:
                (dst / rel).write_bytes(src.read_bytes())
    return dst


@pytest.mark.slow
@pytest.mark.timeout(1500)  # 240 s under load average ~25 (2 vCPU shared); docs/benchmarks.md
def test_non_editable_install_runs_up_and_demo(tmp_path: Path) -> None:
    """`pip install .` (not editable) into a fresh venv, then `kvcake up` with the default config
    and `kvcake demo`, from a directory that is not the clone. Kept cheap: no dependency
    downloads (the venv sees the project venv's packages through a .pth file, --no-deps
    --no-build-isolation), a short demo."""
    pytest.importorskip("torch")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    deps = next(
        p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "fastapi").exists()
    )
    (site / "_kvcake_deps.pth").write_text(f"{deps}\n")
    src = _copy_tree(tmp_path / "src")
    py = str(venv / "bin" / "python")
    pip = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-cache-dir", str(src)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([py, "-c", "import kvcake; print(kvcake.__file__)"], cwd=work,
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert where.startswith(str(site)), where  # the installed copy, not the clone
    kv = [str(venv / "bin" / "kvcake")]
    # The default config file (found in the package); the emulated engine keeps this cheap —
    # the demo below runs the default config's real model.
    up = subprocess.run([*kv, "up", "--detach", "--port", "0", "--backend", "emulated"], cwd=work,
                        capture_output=True, text=True, timeout=600)  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        url = json.loads((work / "runs" / "latest.json").read_text())["url"]
        body = {"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 4}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        for page in ("/dashboard", "/dashboard/static/app.js"):  # package data, installed
            assert httpx.get(url + page, timeout=30).status_code == 200, page
    finally:
        down = subprocess.run([*kv, "down"], cwd=work, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    demo = subprocess.run([*kv, "demo", "--requests", "4", "--max-tokens", "6", "--think-s", "0"],
                          cwd=work, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "prefix-cache hit" in demo.stdout and "trace replay" in demo.stdout, demo.stdout
    assert "demo done" in demo.stdout and "next:" in demo.stdout  # the closing line


def test_a_killed_supervisor_leaves_no_cluster_behind(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[kv]\nmodel = "emulated-llama3-70b"\nkv_block_tokens = 32\n'
        f'[cluster]\nproxy_port = 0\nstore_servers = 0\nrun_dir = "{run_dir}"\n'
        '[instance]\nbackend = "emulated"\nkv_blocks = 64\nthreads = 1\n'
    )
    up = subprocess.Popen([sys.executable, "-m", "kvcake", "up", "--config", str(cfg)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_until((run_dir / "latest.json").exists, timeout=240, every_s=0.2,
                   what="the run record written")  # fmt: skip
        pids = [
            p["pid"]
            for p in json.loads((run_dir / "latest.json").read_text())["processes"].values()
        ]
    finally:
        up.kill()
        up.wait()
    wait_until(lambda: not [p for p in pids if Path(f"/proc/{p}").exists()], timeout=30,
               every_s=0.2, what="no orphaned cluster process")  # fmt: skip


def test_cluster_section_sets_every_port(tmp_path: Path) -> None:
    proxy, master, http, directory, base = free_ports(5, span=50)
    c = make_cluster(tmp_path, cluster={
        "proxy_port": proxy, "master_port": master, "master_http_port": http,
        "directory_port": directory, "instance_base_port": base, "store_servers": 1,
        "store_size": "16MB",
    })  # fmt: skip
    with c:
        m = c.child("master").info
        assert (m["rpc"], m["directory"], m["http"]) == (
            f"127.0.0.1:{master}", f"127.0.0.1:{directory}", f"127.0.0.1:{http}")  # fmt: skip
        assert c.url == f"http://127.0.0.1:{proxy}"
        assert c.instance_urls == {"prefill-0": f"http://127.0.0.1:{base}",
                                   "decode-0": f"http://127.0.0.1:{base + 50}"}  # fmt: skip


def test_restart_backoff_and_exit_descriptions() -> None:
    from kvcake.launch.supervisor import RestartPolicy, describe_exit

    p = RestartPolicy(base_s=0.5, max_s=30.0)
    assert [p.delay(n) for n in (1, 2, 3, 4, 10)] == [0.5, 1.0, 2.0, 4.0, 30.0]
    assert describe_exit(-9) == "killed by SIGKILL" and describe_exit(-15) == "killed by SIGTERM"
    assert describe_exit(2) == "exited with code 2"
