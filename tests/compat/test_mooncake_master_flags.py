"""``kvcake master`` with ``mooncake_master``'s flag names: units converted onto kvcake's
settings, bad values and contradictions refused with a clear error."""

from __future__ import annotations

import pytest

from kvcake.cli import build_parser
from kvcake.compat.mooncake import master_flags
from kvcake.core.errors import ConfigError
from kvcake.store.config import MasterConfig


def master_config(*argv: str) -> MasterConfig:
    from kvcake.core.config import load_config

    args = build_parser().parse_args(["master", *argv])
    master_flags.apply(args)
    over = {k: getattr(args, k, None) for k in MasterConfig.__dataclass_fields__}
    return load_config(MasterConfig, env={}, overrides=over)


def test_units_are_converted() -> None:
    cfg = master_config(
        "--rpc_port=50099", "-metrics_port", "9100", "--default_kv_lease_ttl=2500",
        "--default_kv_soft_pin_ttl=30m", "--max_kv_soft_pin_ttl", "1h", "--client_ttl=7",
        "--eviction_high_watermark_ratio=0.8", "--eviction_ratio=0.1",
        "--allocation_strategy=free_ratio_first", "--put_start_discard_timeout_sec=20",
        "--put_start_release_timeout_sec=600", "--offload_on_evict=false",
    )  # fmt: skip
    assert (cfg.port, cfg.http_port) == (50099, 9100)
    assert cfg.lease_ttl_s == 2.5 and cfg.client_ttl_s == 7
    assert cfg.default_soft_pin_ttl_ms == 30 * 60_000 and cfg.max_soft_pin_ttl_ms == 3_600_000
    assert (cfg.high_watermark, cfg.eviction_ratio) == (0.8, 0.1)
    assert cfg.allocation_strategy == "free_ratio_first"
    assert (cfg.put_start_timeout_s, cfg.put_start_discard_s) == (20, 580)
    assert cfg.offload_on_evict is False


def test_metadata_server_port_is_the_http_port() -> None:
    cfg = master_config("--enable_http_metadata_server", "--http_metadata_server_port=8080")
    assert cfg.http_port == 8080
    with pytest.raises(ConfigError, match="one HTTP port"):
        master_config(
            "--enable_http_metadata_server=true", "--http_metadata_server_port=8080",
            "--metrics_port=9003",
        )  # fmt: skip


def test_kvcake_flags_win_and_bad_values_fail() -> None:
    assert master_config("--rpc_port=1", "--port", "2").port == 2
    with pytest.raises(ConfigError, match="duration"):
        master_config("--default_kv_lease_ttl=soon")
    with pytest.raises(ConfigError, match="etcd_endpoints"):
        master_config("--enable_ha")
    with pytest.raises(ConfigError, match="boolean"):
        master_config("--offload_on_evict=maybe")


def test_etcd_endpoints_mapped_to_the_ha_flag() -> None:
    args = build_parser().parse_args(["master", "--etcd_endpoints=127.0.0.1:2379;h2:2379"])
    master_flags.apply(args)
    assert args.etcd_endpoints == "http://127.0.0.1:2379,http://h2:2379"
