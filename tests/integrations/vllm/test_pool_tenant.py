"""The connector's pool handle against a real master and storage node (no vLLM): its puts are
charged to the connector's tenant, so the store's quotas hold for vLLM engines too."""

from __future__ import annotations

import pytest

from kvcake.core.errors import ConfigError
from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.integrations.vllm.pool import PoolHandle
from kvcake.integrations.vllm.worker import log_for
from kvcake.store.config import MasterConfig, StoreServerConfig
from kvcake.store.errors import QuotaExceeded
from kvcake.store.master_server import Master
from kvcake.store.server import StoreServer

KB = 1024


def test_connector_pool_puts_are_charged_to_its_tenant() -> None:
    m = Master(MasterConfig(port=0, http_port=-1, tenant_quotas=("acme=64KiB",)))
    m.start()
    node = StoreServer(StoreServerConfig(master=m.rpc_address, segment_size=4 << 20, http_port=-1))
    node.start()
    handle = PoolHandle(ConnectorConfig(master=m.rpc_address, tenant="acme"), "kv_both", 5.0,
                        log_for("test"))  # fmt: skip
    try:
        client = handle.client()
        assert client is not None
        client.put("acme/0", b"a" * 48 * KB)
        assert m.state.tenants.stats()["acme"]["used"] == 48 * KB
        with pytest.raises(QuotaExceeded):
            client.put("acme/1", b"a" * 32 * KB)
    finally:
        handle.close()
        node.stop()
        m.stop()


def test_a_bad_tenant_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="tenant"):
        ConnectorConfig(master="127.0.0.1:1", tenant="no spaces please")
