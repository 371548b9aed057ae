"""One ``[conductor]`` section drives the simulator and the live proxy alike (issue 10 §3)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvcake.conductor.config import ConductorConfig, load_conductor_config
from kvcake.core.errors import ConfigError
from kvcake.core.trace import TraceRecord
from kvcake.launch.clusterfile import load_serve_file, toml_dump
from kvcake.proxy.main import make_conductor_factory
from kvcake.serve.config import ProxyConfig, load_proxy_config
from kvcake.serve.wire import InstanceInfo
from kvcake.sim.config import SimConfig, load_sim_config
from kvcake.sim.runner import simulate
from kvcake.sim.sched import build_scheduler

TOML = """
[sim]
prefill_nodes = 2
decode_nodes = 1

[proxy]
max_prompt_tokens = 4096

[conductor]
prefill_policy = "random"
admission_policy = "early-rejection"
ttft_slo_s = 12.5
tbt_slo_s = 0.25
kvcache_balancing_threshold = 3.5
expected_output_tokens = 64
seed = 11
"""

WANT = {"prefill_policy": "random", "admission_policy": "early-rejection", "ttft_slo_s": 12.5,
        "tbt_slo_s": 0.25, "kvcache_balancing_threshold": 3.5, "expected_output_tokens": 64,
        "seed": 11}  # fmt: skip


def _has(cfg: ConductorConfig) -> None:
    assert {k: getattr(cfg, k) for k in WANT} == WANT


def _info() -> InstanceInfo:
    from kvcake.core.api import Role
    from kvcake.core.ids import InstanceId

    cal = {"prefill": [0.01, 1e-4, 1e-9], "decode": [0.01, 1e-4, 1e-8], "time_scale": 1.0}
    return InstanceInfo(InstanceId("prefill-0"), Role.PREFILL, "m", 32, 1024, 512, 8192, 256,
                        (0,), cal)  # fmt: skip


def test_one_section_drives_sim_and_proxy(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(TOML)
    # the simulator: its conductor is built from [conductor], threshold and seed included
    scfg = load_sim_config(path)
    _has(scfg.conductor)
    assert (scfg.prefill_nodes, scfg.decode_nodes) == (2, 1)
    sched = build_scheduler(scfg, colocated=False)
    _has(sched.config)
    recs = [TraceRecord(i * 100.0, 1024, 4, (i % 3, 100 + i)) for i in range(12)]
    assert simulate(recs, scfg).completed.sum() == 12
    # the proxy: the cluster file gives the same section to the proxy's conductor
    conf = load_serve_file(path)
    _has(conf.proxy.conductor)
    assert conf.proxy.max_prompt_tokens == 4096
    conductor = make_conductor_factory(conf.proxy, False)(_info())
    _has(conductor.config)
    # the per-process proxy.toml the launcher writes keeps it (restarts re-read it)
    again = tmp_path / "proxy.toml"
    again.write_text(toml_dump({"kv": conf.kv, "proxy": conf.proxy}))
    assert "[conductor]" in again.read_text()
    assert load_proxy_config(again) == conf.proxy


def test_seed_and_threshold_reach_the_policies(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[conductor]\nprefill_policy = "global-cache-aware"\n'
                    "kvcache_balancing_threshold = 2.5\nseed = 5\n")  # fmt: skip
    sim = build_scheduler(load_sim_config(path), colocated=False)
    live = make_conductor_factory(load_serve_file(path).proxy, False)(_info())
    for c in (sim, live):
        assert c.prefill_policy.threshold == 2.5  # type: ignore[attr-defined]
        assert c.config.seed == 5


def test_flags_override_the_section(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    scfg = load_sim_config(path, {"seed": 3, "speedup": 2.0, "prefill_nodes": None})
    assert (scfg.conductor.seed, scfg.speedup, scfg.prefill_nodes) == (3, 2.0, 2)
    pcfg = load_proxy_config(path, {"port": 0}, {"admission_policy": "none"})
    assert pcfg.conductor.admission_policy == "none" and pcfg.conductor.seed == 11
    env = {"KVCAKE_CONDUCTOR_SEED": "9"}
    assert load_conductor_config(path, env=env).seed == 9


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        (
            '[sim]\nprefill_policy = "random"\n',
            r"sim.prefill_policy -> \[conductor\] prefill_policy",
        ),
        ("[sim]\nseed = 3\n", r"sim.seed -> \[conductor\] seed"),
        ('[proxy]\npolicy = "random"\n', r"proxy.policy -> \[conductor\] prefill_policy"),
        ('[proxy]\nadmission = "none"\n', r"proxy.admission -> \[conductor\] admission_policy"),
        ("[proxy]\ntbt_slo_s = 1.0\n", r"proxy.tbt_slo_s -> \[conductor\] tbt_slo_s"),
        ("[conductor]\nkvcache_balancing_threshold = 0.5\n", r"kvcache_balancing_threshold"),
        ("[conductor]\npolicy = 3\n", r"unknown setting"),
    ],
)
def test_old_keys_name_the_new_place(tmp_path: Path, text: str, hint: str) -> None:
    path = tmp_path / "old.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=hint):
        if text.startswith("[sim]"):
            load_sim_config(path)
        else:
            load_serve_file(path)
    with pytest.raises(ConfigError, match="moved to the"):
        load_serve_file(None, {"proxy": {"admission": "none"}})


def test_one_set_of_names_and_defaults() -> None:
    sim_names = {f.name for f in dataclasses.fields(SimConfig)}
    proxy_names = {f.name for f in dataclasses.fields(ProxyConfig)}
    cond = {f.name for f in dataclasses.fields(ConductorConfig)}
    assert not (cond & sim_names) and not (cond & proxy_names)
    assert SimConfig().conductor == ProxyConfig().conductor == ConductorConfig()
    # with_ routes conductor names to the conductor
    c = SimConfig().with_(prefill_policy="least-load", speedup=3.0)
    assert (c.conductor.prefill_policy, c.speedup) == ("least-load", 3.0)
    with pytest.raises(ConfigError):
        SimConfig().with_(prefill_policy="best-guess")


def test_packaged_cluster_files_have_the_section() -> None:
    from importlib import resources

    for name in ("cluster.toml", "emulated.toml"):
        path = Path(str(resources.files("kvcake") / "configs" / name))
        conf = load_serve_file(path)
        assert conf.proxy.conductor.admission_policy == "early-rejection"
        assert load_sim_config(path).conductor == conf.proxy.conductor
