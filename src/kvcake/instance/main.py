"""Process entry of ``kvcake prefill`` / ``kvcake decode`` (and the colocated ``both``).

Builds the backend (torch or emulated) with its KV memory allocated as a Transfer Engine segment
``kv/<instance id>`` (when a directory is configured), connects to the store, and serves the
instance RPC with uvicorn on a socket bound up front — so a port conflict fails at once with a
message naming the setting to change. SIGTERM: stop accepting, finish running requests, exit.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kvcake.core import auth as _auth
from kvcake.core.api import Role, segment_of
from kvcake.core.config import KVLayoutConfig
from kvcake.core.costmodel import load_calibration, preset
from kvcake.core.http_auth import INSTANCE_HTTP
from kvcake.core.ids import InstanceId
from kvcake.core.memtrace import install_from_env
from kvcake.engine.config import EmulatedConfig
from kvcake.engine.emulated import EmulatedBackend, emulated_layout
from kvcake.instance.app import build_app
from kvcake.instance.instance import Instance
from kvcake.instance.kvlink import PoolLink
from kvcake.instance.store_glue import connect_store
from kvcake.instance.store_watch import StoreWatch
from kvcake.instance.torch_glue import torch_backend
from kvcake.net.httpserve import RequireAuth, serve
from kvcake.net.listen import bind
from kvcake.serve.config import InstanceConfig
from kvcake.transfer import TransferEngine
from kvcake.transfer.dirwatch import DirectoryWatch

log = logging.getLogger(__name__)


def _emulated(cfg: InstanceConfig, kv: KVLayoutConfig, iid: InstanceId, te: Any) -> Any:
    ecfg = EmulatedConfig(
        preset=cfg.preset,
        calibration=cfg.calibration,
        time_scale=cfg.time_scale,
        kv_scale=cfg.kv_scale,
        kv_block_tokens=kv.kv_block_tokens,
        num_kv_blocks=cfg.kv_blocks,
    )
    buf = None
    if te is not None:
        cm = load_calibration(cfg.calibration) if cfg.calibration else preset(cfg.preset)
        layout = emulated_layout(ecfg, cm)
        buf = te.allocate_segment(segment_of(iid), layout.total_bytes)
    return EmulatedBackend(ecfg, buffer=buf, instance_id=iid)


def _torch(cfg: InstanceConfig, kv: KVLayoutConfig, iid: InstanceId, te: Any) -> Any:
    return torch_backend(cfg, kv, iid, te)


BACKEND_FACTORIES = {"emulated": _emulated, "torch": _torch}


def build_instance(role: Role, cfg: InstanceConfig, kv: KVLayoutConfig, iid: InstanceId) -> Any:
    te = None
    if cfg.directory:
        te = TransferEngine(directory=cfg.directory, hostname=cfg.host, listen_hosts=(cfg.host,))
    backend = BACKEND_FACTORIES[cfg.backend](cfg, kv, iid, te)
    pool = None
    if cfg.use_store and cfg.directory:
        client = connect_store(cfg, te)
        if client is not None:
            pool = PoolLink(client, kv.model, kv.dtype, kv.kv_block_tokens, cfg.fetch_deadline_s)
    vocab = int(getattr(backend, "vocab_size", 0) or getattr(backend.cfg, "vocab_size", 32000))
    eos = backend.eos_token_id
    inst = Instance(
        iid, role, backend,
        transfer=te, pool=pool, max_batch=cfg.max_batch,
        max_context=cfg.max_context or int(getattr(backend, "max_context", 0) or 8192),
        vocab_size=vocab,
        eos_token_ids=(eos,) if eos is not None and cfg.backend == "torch" else (),
        model_name=kv.model, dtype=kv.dtype,
    )  # fmt: skip
    inst.te = te  # type: ignore[attr-defined]
    inst.dir_watch = None  # type: ignore[attr-defined]
    if te is not None:  # a restarted directory forgets our KV segment: publish it again
        inst.dir_watch = DirectoryWatch(te, cfg.directory_heartbeat_s).start()  # type: ignore[attr-defined]
    watch = None
    if pool is not None:  # log storage nodes that leave the pool, by name
        watch = StoreWatch(cfg.master, str(iid)).start()
    inst.store_watch = watch  # type: ignore[attr-defined]
    return inst


def run_instance(role: Role, cfg: InstanceConfig, kv: KVLayoutConfig) -> int:
    secret = _auth.resolve(None)  # the instance API (/rpc/*) needs it off loopback
    _auth.check_bind(cfg.host, secret, f"the {role.value} instance")
    sock = bind(cfg.host, cfg.port, f"{role.value} instance (instance.port)")
    port = sock.getsockname()[1]
    iid = InstanceId(cfg.id or f"{role.value}-{port}")

    install_from_env(str(iid))  # KVCAKE_TRACEMALLOC=DIR: heap snapshots on SIGUSR2 (soak.py)
    try:
        inst = build_instance(role, cfg, kv, iid)
    except BaseException:
        sock.close()
        raise
    app = build_app(inst)

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        if cfg.warmup_tokens:
            inst.warm_up(cfg.warmup_tokens)
        inst.start()
        print(f"kvcake {role.value} instance {iid} ready on http://{cfg.host}:{port}", flush=True)
        yield
        await inst.drain()
        inst.close()
        watch = getattr(inst, "store_watch", None)
        if watch is not None:
            watch.close()
        for part in ("dir_watch", "te"):
            obj = getattr(inst, part, None)
            if obj is not None:
                obj.close()
        inst.backend.close()

    app.router.lifespan_context = lifespan
    served: Any = app
    if secret is not None:  # every call but /health signed with the shared secret
        served = RequireAuth(app, secret, INSTANCE_HTTP)
    serve(served, sock, lifespan="on", graceful_s=30)
    return 0
