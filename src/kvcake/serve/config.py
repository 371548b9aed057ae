"""Settings of the serving processes: one instance, the proxy, and a whole local cluster.

All are frozen dataclasses validated in ``__post_init__`` and loaded with
:func:`kvcake.core.config.load_config` (defaults < TOML < ``KVCAKE_*`` env < flags). A cluster
file (``configs/cluster.toml``) has the sections ``[kv]``, ``[cluster]``, ``[instance]`` (defaults
for every prefill/decode instance), ``[proxy]`` and ``[conductor]`` (the proxy's conductor; the
simulator reads the same section).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kvcake.conductor.config import (
    ConductorConfig,
    check_moved,
    load_conductor_config,
    reject_moved,
)
from kvcake.core.config import KVLayoutConfig, load_config, require, setting, size_field

BACKENDS = ("torch", "emulated")


@dataclass(frozen=True)
class InstanceConfig:
    """One prefill or decode instance (``kvcake prefill`` / ``kvcake decode``)."""

    id: str = setting("", 'instance id ("" = <role>-<port>)')
    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(0, "port (0 = a free one)")
    backend: str = setting("torch", "torch (SmolLM2 weights) or emulated (cost-model sleeps)")
    kv_blocks: int = setting(512, "paged KV memory, in blocks of kv.kv_block_tokens tokens")
    threads: int = setting(1, "torch threads")
    max_batch: int = setting(32, "decode: largest continuous batch")
    prefill_chunk: int = setting(512, "tokens per prefill chunk (torch backend)")
    directory: str = setting(
        "", 'host:port of the master\'s DirectoryService (enables KV transfer; "" = none)'
    )
    master: str = setting(
        "", 'host:port of the store master\'s RPC (enables the KV pool; "" = none)'
    )
    calibration: str = setting("", 'cost-model file from `kvcake calibrate` ("" = the preset)')
    time_scale: float = setting(1.0, "emulated: sleep = cost-model time x this")
    kv_scale: float = setting(0.001, "emulated: KV bytes = the preset's bytes/token x this")
    preset: str = setting(
        "llama3-70b/8xA800", "emulated: cost-model preset (when there is no calibration)"
    )
    max_context: int = setting(0, "longest prompt + output (0 = the model's: 8,192 for SmolLM2)")
    use_store: bool = True  # put new blocks into / fetch prefixes from the pool
    # A pool prefix read still going after this many seconds stops; the rest is computed and
    # reported as miss reason `too_slow` (0 = no deadline).
    fetch_deadline_s: float = 0.0
    # Before serving, time a few prefills (up to this many tokens) and decode steps so the
    # online-fitted cost model starts from this machine's speed (0 = start from the seed).
    warmup_tokens: int = 1024
    # How often the instance checks that the directory still lists its KV segment (a restarted
    # directory forgets it; peers then get "unknown segment" until it is published again).
    directory_heartbeat_s: float = 1.0

    def __post_init__(self) -> None:
        require(self.directory_heartbeat_s > 0, "instance.directory_heartbeat_s must be > 0")
        require(self.backend in BACKENDS, f"instance.backend must be one of {BACKENDS}")
        require(0 <= self.port <= 65535, f"instance.port {self.port} out of range")
        require(self.kv_blocks >= 4, "instance.kv_blocks must be >= 4")
        require(1 <= self.threads <= 256, "instance.threads must be in [1, 256]")
        require(self.max_batch >= 1, "instance.max_batch must be >= 1")
        require(self.prefill_chunk >= 1, "instance.prefill_chunk must be >= 1")
        require(self.time_scale >= 0, "instance.time_scale must be >= 0")
        require(self.kv_scale > 0, "instance.kv_scale must be > 0")
        require(self.max_context >= 0, "instance.max_context must be >= 0")
        require(self.warmup_tokens >= 0, "instance.warmup_tokens must be >= 0")
        require(self.fetch_deadline_s >= 0, "instance.fetch_deadline_s must be >= 0")
        for key in ("directory", "master"):
            v = getattr(self, key)
            require(not v or ":" in v, f"instance.{key} must be 'host:port', got {v!r}")


@dataclass(frozen=True)
class ProxyConfig:
    """The OpenAI-compatible front end (``kvcake proxy``)."""

    host: str = setting("127.0.0.1", "address the proxy listens on")
    port: int = setting(8000, "port the proxy listens on")
    prefill: tuple[str, ...] = ()  # instance URLs, e.g. "http://127.0.0.1:8101"
    decode: tuple[str, ...] = ()
    # Names clients may send as `model` (the first is the one reported); () = kv.model.
    served_model_name: tuple[str, ...] = ()
    # The [conductor] section (policies, SLOs, balancing threshold, seed): the very settings
    # the simulator reads; ``load_proxy_config`` fills it.
    conductor: ConductorConfig = field(default_factory=ConductorConfig)
    poll_interval_s: float = 0.1  # how often load reports and KV events are pulled
    instance_timeout_s: float = 600.0
    link_bandwidth: float = 5e9  # bytes/s between instances / from the pool (for predictions)
    max_prompt_tokens: int = 8192
    max_body_bytes: int = size_field("8MiB")  # larger request bodies get 413 before parsing
    master: str = ""  # store master RPC host:port: its KV events keep the pool index ("" = off)
    # The instances' Transfer Engine directory: readiness checks that it lists every
    # instance's KV segment ("" = the one the master hosts; `kvcake up` sets it).
    directory: str = ""
    # rotated to .1 .. .N when it passes request_log_max_bytes
    request_log: str = setting(
        "", 'JSON-lines log, one line per request (`kvcake logs` reads it; "" = off)'
    )
    request_log_max_bytes: int = size_field("64MiB")
    request_log_backups: int = 3
    metrics_names: str = setting(
        "kvcake",
        "/metrics names: kvcake (kvcake:*), vllm (vLLM's vllm:* where vLLM has the metric, "
        'labelled component="kvcake-proxy") or both',
    )
    # OpenAI-style API keys (proxy/auth.py): "KEY" or "KEY=TENANT" entries and/or a file of
    # them, one per line; none = the proxy is open. A key's tenant salts its requests' KV.
    api_keys: tuple[str, ...] = ()
    api_keys_file: Path | None = None

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, f"proxy.port {self.port} out of range")
        require(isinstance(self.conductor, ConductorConfig),
                "proxy.conductor must be a ConductorConfig ([conductor] section)")  # fmt: skip
        require(self.poll_interval_s > 0, "proxy.poll_interval_s must be > 0")
        require(self.link_bandwidth > 0, "proxy.link_bandwidth must be > 0")
        require(self.max_prompt_tokens >= 1, "proxy.max_prompt_tokens must be >= 1")
        require(self.max_body_bytes >= 1024, "proxy.max_body_bytes must be >= 1024")
        require(self.request_log_max_bytes >= 4096, "proxy.request_log_max_bytes must be >= 4KiB")
        require(
            0 <= self.request_log_backups <= 100, "proxy.request_log_backups must be in [0, 100]"
        )
        require(self.metrics_names in ("kvcake", "vllm", "both"),
                f"proxy.metrics_names must be kvcake, vllm or both, got {self.metrics_names!r}")  # fmt: skip


def load_proxy_config(
    toml_path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    conductor: Mapping[str, Any] | None = None,
) -> ProxyConfig:
    """``[proxy]`` + ``[conductor]`` of ``toml_path`` (< env < ``overrides`` / ``conductor``
    overrides). Old ``[proxy]`` conductor keys get a ConfigError naming the new key."""
    check_moved(toml_path, "proxy")
    ov = dict(overrides or {})
    reject_moved("proxy", [k for k, v in ov.items() if v is not None], "proxy overrides")
    ov["conductor"] = load_conductor_config(toml_path, conductor)
    return load_config(ProxyConfig, toml_path=toml_path, section="proxy", overrides=ov)


@dataclass(frozen=True)
class ClusterConfig:
    """What ``kvcake up`` starts. Port 0 means "pick a free port"."""

    prefill: int = 1
    decode: int = 1
    colocated: bool = False  # one "both" instance per prefill slot, no decode instances
    host: str = "127.0.0.1"
    proxy_port: int = 8000
    instance_base_port: int = 0  # 0 = free ports; else prefill i = base+i, decode j = base+50+j
    master_port: int = 0
    master_http_port: int = 0  # the master's admin HTTP (/metrics); 0 = a free port
    directory_port: int = 0  # the master's Transfer Engine DirectoryService (or the bare one's)
    store_servers: int = 1  # 0 = no pool (no master either)
    # The master logs its object metadata to <run_dir>/master-state (`kvcake master
    # --state-dir`), so a restarted master still knows what the pool holds; false = in memory.
    master_state: bool = True
    store_size: int = size_field("256MB")
    run_dir: str = "runs"
    startup_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        require(0 <= self.prefill <= 64, "cluster.prefill must be in [0, 64]")
        require(0 <= self.decode <= 64, "cluster.decode must be in [0, 64]")
        require(self.prefill >= 1, "cluster.prefill must be >= 1")
        require(
            self.colocated or self.decode >= 1,
            "cluster.decode must be >= 1 (or set cluster.colocated = true)",
        )
        require(0 <= self.proxy_port <= 65535, "cluster.proxy_port out of range")
        for key in ("master_port", "master_http_port", "directory_port"):
            require(0 <= getattr(self, key) <= 65535, f"cluster.{key} out of range")
        require(self.store_servers >= 0, "cluster.store_servers must be >= 0")
        require(self.startup_timeout_s > 0, "cluster.startup_timeout_s must be > 0")


@dataclass(frozen=True)
class HaClusterConfig:
    """``[ha]``: the store master highly available on etcd (docs/store.md, "High availability").

    ``etcd = true`` starts one etcd member on free loopback ports (data in the run dir);
    ``etcd_endpoints`` uses an existing one instead. ``masters`` HA masters then campaign, and
    store-servers, instances and the proxy address the pool as ``etcd://HOST:PORT/<cluster>``,
    so they follow the leader."""

    etcd: bool = False
    etcd_endpoints: str = ""  # "host:port[,host:port]" of a running etcd (instead of etcd = true)
    masters: int = 1
    cluster: str = "kvcake"  # etcd key prefix /kvcake/<cluster>/
    ha_lease_ttl_s: int = 2  # a dead leader is replaced about this long after

    def __post_init__(self) -> None:
        require(1 <= self.masters <= 9, "ha.masters must be in [1, 9]")
        require(
            not (self.etcd and self.etcd_endpoints),
            "ha: set either etcd = true (start one) or etcd_endpoints (use one), not both",
        )
        require(
            self.masters == 1 or self.enabled,
            "ha.masters > 1 needs etcd: set ha.etcd = true or ha.etcd_endpoints",
        )
        require(
            all(":" in e and "/" not in e for e in self.etcd_endpoints.split(",") if e),
            f"ha.etcd_endpoints must be 'host:port[,host:port]', got {self.etcd_endpoints!r}",
        )
        require(2 <= self.ha_lease_ttl_s <= 60, "ha.ha_lease_ttl_s must be in [2, 60]")

    @property
    def enabled(self) -> bool:
        return self.etcd or bool(self.etcd_endpoints)


@dataclass(frozen=True)
class ServeFile:
    """A whole cluster file: every section, each validated."""

    kv: KVLayoutConfig = field(default_factory=KVLayoutConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    instance: InstanceConfig = field(default_factory=InstanceConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    ha: HaClusterConfig = field(default_factory=HaClusterConfig)

    def __post_init__(self) -> None:
        require(
            not self.ha.enabled or self.cluster.store_servers >= 1,
            "[ha] needs a store: set cluster.store_servers >= 1",
        )


def default_cluster_file() -> Path:
    """The packaged ``kvcake/configs/cluster.toml`` (``configs/`` in a clone links to it), so
    a non-editable ``pip install`` finds it too."""

    return Path(str(resources.files("kvcake") / "configs" / "cluster.toml"))
