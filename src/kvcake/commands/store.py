"""``kvcake master`` (the store's control plane) and ``kvcake store-server`` (a storage node)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from kvcake.commands._common import serve_until_signal, wait_for_signal
from kvcake.compat.mooncake import master_flags  # mooncake_master's flag names (compat)
from kvcake.core import auth
from kvcake.core.config import add_config_flags, flag_overrides, load_config
from kvcake.store.config import MasterConfig, StoreServerConfig
from kvcake.store.ha.config import HaConfig

T = TypeVar("T")


def _add_config_flags(p: argparse.ArgumentParser, cls: type, with_config: bool = True) -> None:
    if with_config:
        p.add_argument("--config", help="TOML file (flags override it)")
    add_config_flags(p, cls)


def register(sub: Any) -> None:
    m = sub.add_parser(
        "master",
        help="run the store master (metadata, allocation, eviction, directory, /metrics)",
        description="The Mooncake Store master: control plane only (data never passes through "
        "it). Hosts the Transfer Engine directory so one master starts a pool. Settings come "
        "from flags, KVCAKE_MASTER_* variables or a TOML file ([master] section). "
        "Durability/HA (docs/store.md): --state-dir DIR keeps the metadata across restarts; "
        "--etcd-endpoints URL runs one of several masters, elected through etcd ([ha] section, "
        "KVCAKE_HA_*).",
    )
    _add_config_flags(m, MasterConfig)
    _add_config_flags(m, HaConfig, with_config=False)

    master_flags.add_flags(m)
    auth.add_cli_args(m)
    m.set_defaults(func=_master)

    s = sub.add_parser(
        "store-server",
        help="run a storage node: mount a DRAM segment (and optionally an SSD dir) into the pool",
        description="A storage node: contributes --segment-size bytes of shared memory (and, "
        "with --ssd-dir, a disk tier of --ssd-quota bytes) to the pool of --master. SIGTERM "
        "unmounts gracefully. Settings: flags, KVCAKE_STORE_* or TOML ([store] section).",
    )
    _add_config_flags(s, StoreServerConfig)
    auth.add_cli_args(s)
    s.set_defaults(func=_store_server)


def _load(args: argparse.Namespace, cls: type[T], section: str) -> T:
    """``cls`` from --config's ``[section]``, the environment, and the flags given."""

    over = flag_overrides(args, (f.name for f in dataclasses.fields(cls)))  # type: ignore[arg-type]
    return load_config(cls, toml_path=args.config, section=section, overrides=over)


def _master(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.store.master_server import Master

    master_flags.apply(args)
    cfg = _load(args, MasterConfig, "master")
    ha = _load(args, HaConfig, "ha")
    if ha.enabled:
        # lazy: CLI start-up
        from kvcake.commands._ha_master import run_master

        return run_master(cfg, ha)
    master = Master(cfg, cluster=ha.cluster)
    # lazy: CLI start-up
    from kvcake.core.memtrace import install_from_env

    install_from_env("master")  # KVCAKE_TRACEMALLOC=DIR: heap snapshots on SIGUSR2 (soak.py)
    # One parseable line so launchers (tests, the cluster launcher) learn the bound ports.
    return serve_until_signal(
        master,
        "master",
        lambda: (
            f"master rpc={master.rpc_address} directory={master.directory_address} "
            f"http={master.http_address} events={master.events_address}" + _vllm_events(master)
        ),
    )


def _vllm_events(master: Any) -> str:
    """The vLLM-format KV-event stream's PUB and replay addresses, when it is on."""
    s = master.vllm_events
    return f" vllm_events={s.address} vllm_replay={s.replay_address}" if s is not None else ""


def _store_server(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.store.server import StoreServer

    cfg = _load(args, StoreServerConfig, "store")
    server = StoreServer(cfg)
    server.start()
    print(
        f"store-server segment={server.segment_name} disk={server.disk_endpoint} "
        f"http={server.http_address}",
        flush=True,
    )
    try:
        wait_for_signal()
    finally:
        server.stop()
    return 0
