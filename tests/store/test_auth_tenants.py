"""Per-tenant byte quotas in the master (issue 15 §4): a put that would take its tenant past its
quota gets QuotaExceeded at put_start; nothing of any other tenant is evicted for it; every way
an object leaves releases its tenant's charge (MasterState.check asserts the accounting)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvcake.core.errors import ConfigError
from kvcake.core.ids import ClientId, SegmentName
from kvcake.core.integrity import chunk_count
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig, MasterConfig, StoreServerConfig
from kvcake.store.errors import InvalidParams, NoSpace, QuotaExceeded
from kvcake.store.master_server import Master
from kvcake.store.master_state import MasterState
from kvcake.store.protocol import PutOptions
from kvcake.store.server import StoreServer

W = ClientId("writer")
KB = 1024


def state(**kw: object) -> MasterState:
    st = MasterState(MasterConfig(**kw))  # type: ignore[arg-type]
    st.mount(ClientId("node"), "h", SegmentName("seg"), 64 * KB)
    return st


def put(st: MasterState, key: str, size: int, tenant: str) -> None:
    st.put_start(W, "h", key, size, PutOptions(), tenant=tenant)
    st.put_end(W, key, [0] * chunk_count(size))  # well formed (a replay keeps only those)


def test_quota_refuses_before_allocating_and_counts_every_exit() -> None:
    st = state(tenant_quotas=("a=10KiB",), tenant_quota=20 * KB)
    for i in range(5):
        put(st, f"a/{i}", 2 * KB, "a")
    with pytest.raises(QuotaExceeded, match="tenant 'a' is over its quota") as info:
        st.put_start(W, "h", "a/5", 1, PutOptions(), tenant="a")
    assert isinstance(info.value, NoSpace) and info.value.code == -2001
    assert "a/5" not in st.objects
    put(st, "b/0", 16 * KB, "b")  # the default quota of other named tenants
    with pytest.raises(QuotaExceeded):
        st.put_start(W, "h", "b/1", 8 * KB, PutOptions(), tenant="b")
    put(st, "none/0", 30 * KB, "")  # no tenant: never limited
    st.check()
    # Every way out releases the charge: remove, revoke, eviction.
    st.remove("a/0")
    st.put_start(W, "h", "a/r", 2 * KB, PutOptions(), tenant="a")
    st.put_revoke(W, "a/r")
    assert st.tenants.used["a"] == 8 * KB
    put(st, "a/5", 2 * KB, "a")  # fits again
    st.check()
    st.unmount(ClientId("node"), SegmentName("seg"))  # segment loss drops every object
    assert st.tenants.used == {}
    st.check()


def test_over_quota_put_evicts_nothing() -> None:
    """The pool is full of tenant b's objects; tenant a, at its quota, is refused, and b keeps
    every object (a within-quota put would evict the LRU head as usual)."""
    st = state(tenant_quotas=("a=8KiB",))
    put(st, "a/0", 8 * KB, "a")
    for i in range(7):
        put(st, f"b/{i}", 8 * KB, "b")  # 64 KiB segment: full
    before = set(st.objects)
    with pytest.raises(QuotaExceeded):
        st.put_start(W, "h", "a/1", 8 * KB, PutOptions(), tenant="a")
    assert set(st.objects) == before and st.evicted_objects == 0
    st.check()


def test_bad_tenant_ids() -> None:
    st = state()
    for bad in ("-x", "a b", "x" * 65, "ä", "a/b"):
        with pytest.raises(InvalidParams, match="bad tenant id"):
            st.put_start(W, "h", "k", 1, PutOptions(), tenant=bad)
    with pytest.raises(ConfigError, match="tenant_quotas"):
        MasterConfig(tenant_quotas=("a:1GiB",))
    with pytest.raises(ConfigError, match="client.tenant"):
        ClientConfig(tenant="no spaces allowed")


@pytest.fixture(scope="module")
def live() -> Iterator[Master]:
    m = Master(MasterConfig(port=0, http_port=-1, tenant_quotas=("small=64KiB",)))
    m.start()
    node = StoreServer(StoreServerConfig(master=m.rpc_address, segment_size=4 << 20, http_port=-1))
    node.start()
    yield m
    node.stop()
    m.stop()


def test_quota_over_rpc_is_typed_and_spares_other_tenants(live: Master) -> None:
    with (
        Client(ClientConfig(master=live.rpc_address, tenant="small")) as small,
        Client(ClientConfig(master=live.rpc_address, tenant="big")) as big,
    ):
        big_keys = [f"big/{i}" for i in range(8)]
        assert big.batch_put(big_keys, [bytes([i]) * 32 * KB for i in range(8)]) == [None] * 8
        small.put("small/0", b"s" * 48 * KB)
        with pytest.raises(QuotaExceeded, match="'small' is over its quota"):
            small.put("small/1", b"s" * 32 * KB)
        results = small.batch_put(["small/2", "small/3"], [b"x" * 8 * KB, b"y" * 16 * KB])
        assert results[0] is None and isinstance(results[1], QuotaExceeded)
        for i, k in enumerate(big_keys):  # other tenant's objects intact
            assert bytes(big.get(k)) == bytes([i]) * 32 * KB
        assert live.state.tenants.stats()["small"] == {"used": 56 * KB, "quota": 64 * KB}
        live.state.check()
    from prometheus_client import generate_latest

    text = generate_latest(live.metrics.registry).decode()
    assert f'kvcake_store_tenant_used_bytes{{tenant="small"}} {56.0 * KB}' in text
    assert f'kvcake_store_tenant_quota_bytes{{tenant="small"}} {64.0 * KB}' in text
    assert "kvcake_store_quota_refusals 2.0" in text


def test_tenant_charges_survive_replay() -> None:
    """The operation log records an object's tenant; a new leader (or a --state-dir restart)
    charges it again, so a quota holds across failovers."""
    from kvcake.store.ha.journal import JournaledState
    from kvcake.store.ha.replay import build_state
    from kvcake.store.ha.view import ObjRec, View

    cfg = MasterConfig(http_port=-1, tenant_quotas=("a=10KiB",))
    js = JournaledState(cfg)
    js.mount(ClientId("node"), "h", SegmentName("seg"), 64 * KB)
    for i in range(4):
        put(js, f"a/{i}", 2 * KB, "a")
    view = View()
    for rec in js.records():
        view.apply(rec)
    assert {r.tenant for r in view.objects.values()} == {"a"}
    old = ObjRec("old", 100, False, [("seg", 60 * KB, "memory")])  # a record without a tenant
    assert old.tenant == ""
    state = build_state(cfg, view)
    state.check()
    assert state.tenants.used == {"a": 8 * KB}
    with pytest.raises(QuotaExceeded):
        state.put_start(W, "h", "a/9", 4 * KB, PutOptions(), tenant="a")
