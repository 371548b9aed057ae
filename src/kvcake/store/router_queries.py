"""Routers' cache queries on the master's HTTP (docs/integrations/routers.md):

- ``GET /batch_query_keys?keys=a,b``: Mooncake's master route, same shape — ``{"success": true,
  "data": {key: {"ok": true, "values": [memory replicas], "disk_values": [disk/file replicas]}
  | {"ok": false, "error": "OBJECT_NOT_FOUND"}}}``; only complete (readable) copies are listed.
- ``POST /query`` (Mooncake RFC 1403, the Conductor indexer's API): for a prompt's token ids,
  the longest prefix the pool holds, per tenant and per instance (the pool is one instance,
  ``kvcake-pool``), with the matched tokens per medium (``GPU`` always 0: the pool holds no
  GPU memory; ``CPU`` = memory tier, ``DISK`` = disk and file tiers). kvcake's block keys need
  the dtype and block size besides the model (``core.hashing.block_key``), so the request
  names them; the tenant is the hash chain's salt, so one tenant's query never matches
  another's blocks.

Both only read the state (``describe_key``), are bounded (keys and tokens per request), and
answer malformed input with 400 and a message. Signed like every master route (H5's auth).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from kvcake.core.hashing import block_hashes, block_key, rank_key

if TYPE_CHECKING:
    from kvcake.store.admin import ReplicaView
    from kvcake.store.master_server import Master
    from kvcake.store.master_state import MasterState

MAX_KEYS = 1000  # per /batch_query_keys
MAX_TOKENS = 1 << 17  # per /query
POOL_INSTANCE = "kvcake-pool"
_MEMORY, _DISK = ("memory",), ("disk", "file")


class BadQuery(ValueError):
    """A malformed router query (answered 400)."""


def _bad(message: str) -> JSONResponse:
    return JSONResponse({"success": False, "error": message}, status_code=400)


def _descriptor(rep: ReplicaView) -> dict[str, object]:
    """A replica as Mooncake's buffer descriptor names it, plus kvcake's segment and tier."""
    return {
        "transport_endpoint_": rep["segment"],
        "buffer_address_": rep["offset"],
        "size_": rep["size"],
        "segment": rep["segment"],
        "tier": rep["tier"],
    }


def batch_query(state: MasterState, keys: list[str]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key in keys:
        found = state.describe_key(key)
        reps = [r for r in (found["replicas"] if found else []) if r["complete"]]
        if not reps:
            data[key] = {"ok": False, "error": "OBJECT_NOT_FOUND"}
            continue
        data[key] = {
            "ok": True,
            "values": [_descriptor(r) for r in reps if r["tier"] in _MEMORY],
            "disk_values": [_descriptor(r) for r in reps if r["tier"] in _DISK],
        }
    return {"success": True, "data": data}


def _field(body: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None or not isinstance(value, kind) or isinstance(value, bool):
        raise BadQuery(f"{name!r} must be a {kind.__name__}")
    return value


def parse_query(body: Any) -> tuple[str, str, int, list[int], str, int]:
    """(model, dtype, block_size, token_ids, tenant, tp_size) of a /query body."""
    if not isinstance(body, dict):
        raise BadQuery("the body must be a JSON object")
    model, dtype = _field(body, "model", str), _field(body, "dtype", str)
    block_size, tp = _field(body, "block_size", int), _field(body, "tp_size", int, 1)
    tokens = _field(body, "token_ids", list)
    tenant = _field(body, "tenant_id", str, "")
    if not 0 < block_size <= 4096 or not 0 < tp <= 64:
        raise BadQuery("block_size must be in [1, 4096] and tp_size in [1, 64]")
    if len(tokens) > MAX_TOKENS:
        raise BadQuery(f"at most {MAX_TOKENS} token_ids per query")
    if not all(type(t) is int and 0 <= t < 2**32 for t in tokens):
        raise BadQuery("token_ids must be integers in [0, 2**32)")
    return model, dtype, block_size, tokens, tenant, tp


def _tiers(state: MasterState, key: str, tp: int) -> set[str]:
    """Tiers holding a complete copy of a block (rank 0's object stands for the block)."""
    for k in (rank_key(key, 0, tp), key):
        found = state.describe_key(k)
        if found is not None:
            return {r["tier"] for r in found["replicas"] if r["complete"]}
    return set()


def prefix_query(state: MasterState, body: Any) -> dict[str, Any]:
    model, dtype, bs, tokens, tenant, tp = parse_query(body)
    longest = cpu = disk = 0
    cpu_run = disk_run = True
    for h in block_hashes(tokens, bs, salt=tenant):
        tiers = _tiers(state, block_key(model, dtype, bs, h), tp)
        if not tiers:
            break
        longest += bs
        cpu_run = cpu_run and bool(tiers & set(_MEMORY))
        disk_run = disk_run and bool(tiers & set(_DISK))
        cpu += bs if cpu_run else 0
        disk += bs if disk_run else 0
    hit = {"longest_matched": longest, "GPU": 0, "CPU": cpu, "DISK": disk, "DP": {}}
    return {tenant or "default": {POOL_INSTANCE: hit} if longest else {}}


def router_queries(master: Master) -> APIRouter:
    router = APIRouter()
    state = master.state

    @router.get("/batch_query_keys")
    def batch_query_keys(keys: str = "") -> Any:
        names = [k for k in keys.split(",") if k]
        if not names:
            return _bad("No keys provided. Use ?keys=key1,key2,...")
        if len(names) > MAX_KEYS:
            return _bad(f"at most {MAX_KEYS} keys per request, got {len(names)}")
        return batch_query(state, names)

    @router.post("/query")
    async def query(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            return _bad("the body must be JSON")
        try:
            return await run_in_threadpool(prefix_query, state, body)
        except BadQuery as exc:
            return _bad(str(exc))

    return router
