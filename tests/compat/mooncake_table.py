"""The call table: one script, run by either Python — kvcake's (with the ``mooncake`` shim on
``sys.path``) or the real wheel's venv — so the two ``mooncake`` packages never meet.

    PYTHON tests/compat/mooncake_table.py MASTER_ADDR [METADATA_SERVER]  ->  JSON on stdout

Every case is a named call (good and bad inputs) whose result is normalised to JSON
(ints, ``b:<hex>``, lists, ``EXC:<Type>`` for an exception). ``test_mooncake_table.py`` compares
the output with the expected table and, where the wheel is installed, with the wheel's output.
The cases run in order on one store; each starts from keys it owns.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
from collections.abc import Callable
from typing import Any

MB = 1024 * 1024
CRASH = "SEGFAULT-IN-WHEEL"  # the wheel kills the process on this call: not run there


def norm(v: Any) -> Any:
    name = type(v).__name__
    if name == "BufferHandle":
        n = v.size()
        return {"handle": n, "head": norm(ctypes.string_at(v.ptr(), min(n, 8))) if n else None}
    if hasattr(type(v), "__members__") and hasattr(v, "name"):  # pybind11 enum or IntEnum
        return f"{name}.{v.name}"
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        return "b:" + b.hex() if len(b) <= 32 else f"b[{len(b)}]:{hashlib.md5(b).hexdigest()[:8]}"
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [norm(x) for x in v]
    if isinstance(v, dict):
        return {str(k): norm(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if name == "Tensor":
        return {"tensor": str(v.dtype), "shape": list(v.shape), "sum": round(float(v.sum()), 3)}
    if name == "ReplicaDescriptor":
        return {"replica": "memory" if v.is_memory_replica() else "disk", "status": norm(v.status)}
    return f"<{name}>"


def run_cases(store_mod: Any, master: str, metadata: str) -> dict[str, Any]:
    ms = store_mod
    S = ms.MooncakeDistributedStore
    out: dict[str, Any] = {}
    bufs: list[Any] = []

    def buf(data: bytes | int) -> int:
        b = ctypes.create_string_buffer(
            data if isinstance(data, bytes) else b"\0" * data,
            len(data) if isinstance(data, bytes) else data,
        )
        bufs.append(b)
        return ctypes.addressof(b)

    wheel = not getattr(ms, "__kvcake__", False)

    def case(name: str, fn: Callable[[], Any], crashes_wheel: bool = False) -> Any:
        if crashes_wheel and wheel:
            out[name] = CRASH
            return None
        sys.stderr.write(f"[case] {name}\n")
        sys.stderr.flush()
        try:
            r = fn()
        except BaseException as exc:
            out[name] = f"EXC:{type(exc).__name__}"
            return None
        out[name] = norm(r)
        return r

    # --- module names ------------------------------------------------------------------------
    case(
        "mod.soft_pin_values",
        lambda: [
            int(ms.SoftPinAction.PRESERVE.value),
            int(ms.SoftPinAction.ENABLE.value),
            int(ms.SoftPinAction.DISABLE.value),
        ],
    )
    case(
        "mod.replica_status",
        lambda: [
            ms.ReplicaStatus.UNDEFINED.value,
            ms.ReplicaStatus.COMPLETE.value,
            ms.ReplicaStatus.FAILED.value,
        ],
    )
    case(
        "mod.object_data_type",
        lambda: [
            ms.KVCACHE.value,
            ms.TENSOR.value,
            ms.GENERAL.value,
            ms.ObjectDataType.UNKNOWN.value,
        ],
    )
    case(
        "mod.task_enums",
        lambda: [ms.TaskStatus.SUCCESS.value, ms.TaskType.REPLICA_MOVE.value, ms.PENDING.value],
    )
    case("mod.metadata_size", lambda: ms._tensor_metadata_size())

    def cfg_str() -> Any:
        c = ms.ReplicateConfig()
        return [
            c.replica_num,
            c.with_hard_pin,
            c.soft_pin_ttl_ms,
            list(c.preferred_segments),
            c.preferred_segment,
            c.prefer_alloc_in_same_node,
        ]

    case("cfg.defaults", cfg_str)

    def cfg_bad_attr() -> Any:
        c = ms.ReplicateConfig()
        c.no_such_field = 1

    case("cfg.bad_attr", cfg_bad_attr)

    def cfg_bad_type() -> Any:
        c = ms.ReplicateConfig()
        c.replica_num = "two"

    case("cfg.bad_type", cfg_bad_type)

    def cfg_group_ids() -> Any:  # Optional[list[str]]: None by default, settable back to None
        c = ms.ReplicateConfig()
        out: list[Any] = [c.group_ids]
        c.group_ids = ("g-a", "")
        out += [c.group_ids, str(c)]
        c.group_ids = None
        return [*out, c.group_ids, str(c)]

    case("cfg.group_ids", cfg_group_ids)

    def cfg_group_ids_bad() -> Any:
        c = ms.ReplicateConfig()
        c.group_ids = [1]

    case("cfg.group_ids_bad", cfg_group_ids_bad)

    # --- before setup ------------------------------------------------------------------------
    pre = S()
    case("pre.health", lambda: pre.health_check())
    case("pre.put", lambda: pre.put("k", b"v"), crashes_wheel=True)
    case("pre.get", lambda: pre.get("k"))
    case("pre.is_exist", lambda: pre.is_exist("k"), crashes_wheel=True)
    case("pre.get_batch", lambda: pre.get_batch(["a"]))
    case("pre.get_size", lambda: pre.get_size("k"), crashes_wheel=True)
    case("pre.remove", lambda: pre.remove("k"), crashes_wheel=True)
    case("pre.hostname", lambda: pre.get_hostname(), crashes_wheel=True)
    case("pre.close", lambda: pre.close())

    # --- setup -------------------------------------------------------------------------------
    bad = S()
    case("setup.bad_kw", lambda: bad.setup(local_hostnme="127.0.0.1"))
    case("setup.too_few", lambda: bad.setup("127.0.0.1", "P2PHANDSHAKE"))
    case(
        "setup.bad_metadata",
        lambda: bad.setup("127.0.0.1", "bogus://x", 16 * MB, 16 * MB, "tcp", "", master),
        crashes_wheel=True,
    )
    case(
        "setup.bad_master",
        lambda: bad.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "", "127.0.0.1:1"),
    )
    case("setup.dict_missing_required", lambda: bad.setup({"master_server_addr": master}))
    bad.close()

    st = S()
    case("setup.ok", lambda: st.setup("127.0.0.1", metadata, 64 * MB, 64 * MB, "tcp", "", master))
    case(
        "setup.again", lambda: st.setup("127.0.0.1", metadata, 64 * MB, 64 * MB, "tcp", "", master)
    )
    case("health", lambda: st.health_check())
    case(
        "hostname_has_port",
        lambda: ":" in st.get_hostname() and st.get_hostname().startswith("127.0.0.1:"),
    )
    case("offload_rpc_read_count", lambda: st.get_offload_rpc_read_count())

    # --- put / get ---------------------------------------------------------------------------
    case("put.ok", lambda: st.put("t.k", b"v1"))
    case("put.exists", lambda: st.put("t.k", b"v2"))
    case("get.ok", lambda: st.get("t.k"))
    case("get.miss", lambda: st.get("t.missing"))
    case("put.empty_key", lambda: st.put("", b"x"))
    case("put.empty_value", lambda: st.put("t.empty", b""))
    case("put.bad_value_type", lambda: st.put("t.int", 5))
    case("put.bad_kw", lambda: st.put("t.kw", b"x", confg=None))
    case("put.none_key", lambda: st.put(None, b"x"))
    case("get.empty_key", lambda: st.get(""))
    case("get_size.ok", lambda: st.get_size("t.k"))
    case("get_size.miss", lambda: st.get_size("t.missing"))
    case("is_exist.ok", lambda: st.is_exist("t.k"))
    case("is_exist.miss", lambda: st.is_exist("t.missing"))
    case("batch_is_exist", lambda: st.batch_is_exist(["t.k", "t.missing"]))
    case("batch_is_exist.empty", lambda: st.batch_is_exist([]))
    case("put_parts", lambda: st.put_parts("t.parts", b"ab", memoryview(b"cd"), bytearray(b"e")))
    case("get.parts", lambda: st.get("t.parts"))
    case("put_parts.none", lambda: st.put_parts("t.parts0"))
    case("upsert.leased", lambda: st.upsert("t.k", b"new"))
    case("upsert.new", lambda: st.upsert("t.u", b"old"))
    case("upsert.same_size", lambda: st.upsert("t.u", b"new"))
    case("get.upserted", lambda: st.get("t.u"))
    case("upsert_parts", lambda: st.upsert_parts("t.up", b"x", b"y"))
    case("get_buffer.ok", lambda: st.get_buffer("t.parts"))
    case("get_buffer.miss", lambda: st.get_buffer("t.missing"))
    case("batch_get_buffer", lambda: st.batch_get_buffer(["t.parts", "t.missing"]))

    # --- batches -----------------------------------------------------------------------------
    keys = [f"t.b{i}" for i in range(4)]
    vals = [bytes([65 + i]) * (i + 1) for i in range(4)]
    case("put_batch.ok", lambda: st.put_batch(keys, vals))
    case("get_batch.ok", lambda: st.get_batch([*keys, "t.missing"]))
    case("put_batch.mismatch", lambda: st.put_batch(["t.m1", "t.m2"], [b"1"]))
    case("put_batch.empty", lambda: st.put_batch([], []))
    case("put_batch.empty_key", lambda: st.put_batch(["t.ok1", ""], [b"1", b"2"]))
    case("get_batch.empty", lambda: st.get_batch([]))
    case("upsert_batch", lambda: st.upsert_batch(["t.ub1", "t.ub2"], [b"1", b"22"]))
    case("upsert_batch.mismatch", lambda: st.upsert_batch(["t.ub1"], []))

    # --- ReplicateConfig in puts ---------------------------------------------------------------
    def cfg(**kw: Any) -> Any:
        c = ms.ReplicateConfig()
        for k, v in kw.items():
            setattr(c, k, v)
        return c

    case("cfg.str", lambda: str(ms.ReplicateConfig()))
    case(
        "cfg.str_pinned",
        lambda: str(
            cfg(
                soft_pin_action=ms.SoftPinAction.ENABLE,
                soft_pin_ttl_ms=1000,
                with_hard_pin=True,
                replica_num=2,
            )
        ),
    )
    case("cfg.ttl_without_action", lambda: st.put("t.c1", b"x", cfg(soft_pin_ttl_ms=1000)))
    case(
        "cfg.ttl_with_action",
        lambda: st.put(
            "t.c2", b"x", cfg(soft_pin_action=ms.SoftPinAction.ENABLE, soft_pin_ttl_ms=1000)
        ),
    )
    case("cfg.hard_pin", lambda: st.put("t.c3", b"x", cfg(with_hard_pin=True)))
    case(
        "cfg.replicas_best_effort",
        lambda: [st.put("t.c4", b"x", cfg(replica_num=3)), len(st.get_replica_desc("t.c4"))],
    )
    case(
        "cfg.disable_action",
        lambda: st.put("t.c5", b"x", cfg(soft_pin_action=ms.SoftPinAction.DISABLE)),
    )
    case(
        "cfg.batch_ttl_without_action",
        lambda: st.put_batch(["t.c6"], [b"x"], cfg(soft_pin_ttl_ms=5)),
    )

    # --- pointers ----------------------------------------------------------------------------
    src = buf(bytes(range(256)) * 16)
    dst = buf(4096)
    small = buf(16)
    case("register.ok", lambda: st.register_buffer(src, 4096))
    case("register.dst", lambda: st.register_buffer(dst, 4096))
    case("put_from.ok", lambda: st.put_from("t.p", src, 4096))
    case("get_into.ok", lambda: st.get_into("t.p", dst, 4096))
    case("get_into.data", lambda: ctypes.string_at(dst, 4096))
    case("get_into.small", lambda: st.get_into("t.p", small, 16))
    case("get_into.miss", lambda: st.get_into("t.missing", dst, 4096))
    case("put_from.empty_key", lambda: st.put_from("", src, 10))
    case("put_from.zero", lambda: st.put_from("t.zero", src, 0))
    case("upsert_from", lambda: st.upsert_from("t.pu", src, 64))
    case(
        "batch_put_from",
        lambda: st.batch_put_from(["t.p1", "t.p2"], [src, src + 2048], [2048, 2048]),
    )
    case(
        "batch_get_into",
        lambda: st.batch_get_into(
            ["t.p1", "t.p2", "t.missing"], [dst, dst + 2048, dst], [2048, 2048, 4]
        ),
    )
    case("batch_put_from.mismatch", lambda: st.batch_put_from(["t.a", "t.b"], [src], [4]))
    case("batch_put_from.empty", lambda: st.batch_put_from([], [], []))
    case("batch_get_into.empty", lambda: st.batch_get_into([], [], []))
    case("batch_upsert_from", lambda: st.batch_upsert_from(["t.pu", "t.pu2"], [src, src], [64, 8]))
    case(
        "multi.put", lambda: st.batch_put_from_multi_buffers(["t.m"], [[src, src + 2048]], [[8, 8]])
    )
    o1, o2 = buf(8), buf(8)
    case("multi.get", lambda: st.batch_get_into_multi_buffers(["t.m"], [[o1, o2]], [[8, 8]]))
    case("multi.data", lambda: ctypes.string_at(o1, 8) + ctypes.string_at(o2, 8))
    case("multi.get_small", lambda: st.batch_get_into_multi_buffers(["t.m"], [[o1]], [[8]]))
    case(
        "multi.mismatch", lambda: st.batch_put_from_multi_buffers(["t.m2", "t.m3"], [[src]], [[8]])
    )
    r1 = buf(16)
    case(
        "ranges.unregistered", lambda: st.get_into_ranges([r1], [["t.p"]], [[[0]]], [[[0]]], [[4]])
    )
    case("ranges.register", lambda: st.register_buffer(r1, 16))
    case(
        "ranges.get_into",
        lambda: st.get_into_ranges([r1], [["t.p"]], [[[0, 8]]], [[[0, 256]]], [[[4, 4]]]),
    )
    case("ranges.data", lambda: ctypes.string_at(r1, 16))
    rk = [r1], [["t.p", "t.p"]]
    case(
        "ranges.mismatch_key",
        lambda: st.get_into_ranges(*rk, [[[0], []]], [[[0, 1], []]], [[[4, 4], []]]),
    )
    case(
        "ranges.mismatch_keys", lambda: st.get_into_ranges(*rk, [[[0]]], [[[0], [0]]], [[[4], [4]]])
    )
    case(
        "ranges.mismatch_buffers",
        lambda: st.get_into_ranges([r1, r1], [["t.p"]], [[[0]]], [[[0]]], [[[4]]]),
    )
    case("ranges.zero_size", lambda: st.get_into_ranges([r1], [["t.p"]], [[[0]]], [[[0]]], [[[0]]]))
    case("ranges.empty", lambda: st.get_into_ranges([], [], [], [], []))
    case("unregister.ok", lambda: st.unregister_buffer(src))
    case("unregister.again", lambda: st.unregister_buffer(src))

    # --- sessions ----------------------------------------------------------------------------
    case("psession.start", lambda: st.batch_put_session_start(["t.s1", "t.s2"], [8, 8]))
    case("psession.exist_before_end", lambda: st.is_exist("t.s1"))
    w1 = buf(b"ABCDEFGH")
    case(
        "psession.ranges",
        lambda: st.batch_put_from_multi_buffer_ranges(["t.s1"], [[w1, w1 + 4]], [[4, 4]], [[4, 0]]),
    )
    case("psession.end", lambda: st.batch_put_session_end(["t.s1"]))
    case("psession.get", lambda: st.get("t.s1"))
    case("psession.revoke", lambda: st.batch_put_session_revoke(["t.s2"]))
    case("psession.revoke_again", lambda: st.batch_put_session_revoke(["t.s2"]))
    case("psession.end_unknown", lambda: st.batch_put_session_end(["t.nosession"]))
    case("psession.mismatch", lambda: st.batch_put_session_start(["t.s3"], []))
    case("gsession.start", lambda: st.batch_get_session_start(["t.s1", "t.missing"]))
    g1 = buf(8)
    case(
        "gsession.ranges",
        lambda: st.batch_get_into_multi_buffer_ranges(["t.s1"], [[g1, g1 + 4]], [[4, 4]], [[4, 0]]),
    )
    case("gsession.data", lambda: ctypes.string_at(g1, 8))
    case("gsession.end", lambda: st.batch_get_session_end(["t.s1", "t.missing"]))

    # --- replicas and tasks ------------------------------------------------------------------
    case("replica_desc", lambda: st.get_replica_desc("t.k"))
    case("replica_desc.miss", lambda: st.get_replica_desc("t.missing"))
    case("replica_desc.batch", lambda: st.batch_get_replica_desc(["t.k", "t.missing"]))

    def mem_desc() -> Any:
        d = st.get_replica_desc("t.p")[0].get_memory_descriptor().buffer_descriptor
        return [d.size, d.buffer_address != 0, ":" in d.transport_endpoint]

    case("replica_desc.memory", mem_desc)
    case("replica_desc.disk_of_memory", lambda: st.get_replica_desc("t.p")[0].is_disk_replica())
    case("replica_clear.leased", lambda: st.batch_replica_clear(["t.k"]))
    case("replica_clear.miss", lambda: st.batch_replica_clear(["t.missing"]))
    case("copy_task.bad_target", lambda: st.create_copy_task("t.k", ["nowhere"])[1])
    case("move_task.bad", lambda: st.create_move_task("t.k", "nowhere", "nowhere2")[1])
    me = st.get_hostname()
    case("move_task.same", lambda: st.create_move_task("t.k", me, me)[1])
    case("copy_task.miss", lambda: st.create_copy_task("t.missing", [st.get_hostname()])[1])
    case("query_task.unknown", lambda: st.query_task((1, 2))[1])

    # --- tensors -----------------------------------------------------------------------------
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        case("tensor.put", lambda: st.put_tensor("t.t", t))
        case("tensor.get", lambda: st.get_tensor("t.t"))
        case("tensor.get_miss", lambda: st.get_tensor("t.missing"))
        case("tensor.put_bad", lambda: st.put_tensor("t.tb", b"notatensor"))
        case(
            "tensor.bf16",
            lambda: (st.put_tensor("t.bf", t.to(torch.bfloat16)), st.get_tensor("t.bf")),
        )
        case("tensor.batch_put", lambda: st.batch_put_tensor(["t.t1", "t.t2"], [t, t * 2]))
        case("tensor.batch_get", lambda: st.batch_get_tensor(["t.t1", "t.t2", "t.missing"]))
        case("tensor.batch_put_mismatch", lambda: st.batch_put_tensor(["t.t3"], []))
        st.put_tensor("t.tu", t)
        case("tensor.upsert", lambda: st.upsert_tensor("t.tu", t + 1))
        case("tensor.upsert_get", lambda: st.get_tensor("t.tu"))
        case("tensor.batch_upsert", lambda: st.batch_upsert_tensor(["t.tu2"], [t - 1]))
        case("tensor.batch_upsert_get", lambda: st.get_tensor("t.tu2"))
        case("tensor.pub", lambda: st.pub_tensor("t.pub", t))
        case("tensor.upsert_pub", lambda: st.upsert_pub_tensor("t.pub", t * 3))
        case("tensor.batch_pub", lambda: st.batch_pub_tensor(["t.pub1", "t.pub2"], [t, t]))
        case("tensor.batch_upsert_pub", lambda: st.batch_upsert_pub_tensor(["t.pub1"], [t]))
        case(
            "tensor.tp_put",
            lambda: st.put_tensor_with_tp("t.tp", t, tp_rank=0, tp_size=2, split_dim=1),
        )
        case(
            "tensor.tp_get0",
            lambda: st.get_tensor_with_tp("t.tp", tp_rank=0, tp_size=2, split_dim=1),
        )
        case(
            "tensor.tp_get1",
            lambda: st.get_tensor_with_tp("t.tp", tp_rank=1, tp_size=2, split_dim=1),
        )
        case("tensor.tp_raw_key", lambda: st.get_tensor("t.tp_tp_1"))
        case("tensor.tp_get_miss", lambda: st.get_tensor_with_tp("t.missing", tp_rank=0, tp_size=2))
        case("tensor.tp_plain_key", lambda: st.get_tensor_with_tp("t.t", tp_rank=0, tp_size=2))
        case(
            "tensor.tp1_put",
            lambda: [
                st.put_tensor_with_tp("t.tp1", t, tp_size=1),
                st.is_exist("t.tp1"),
                st.is_exist("t.tp1_tp_0"),
            ],
        )
        case("tensor.tp_batch", lambda: st.batch_put_tensor_with_tp(["t.tpb"], [t], tp_size=2))
        case(
            "tensor.tp_batch_get",
            lambda: st.batch_get_tensor_with_tp(["t.tpb"], tp_rank=1, tp_size=2),
        )
        case("tensor.pub_tp", lambda: st.pub_tensor_with_tp("t.ptp", t, tp_size=2))
        case("tensor.batch_pub_tp", lambda: st.batch_pub_tensor_with_tp(["t.bptp"], [t], tp_size=2))
        n = t.numel() * 4 + ms._tensor_metadata_size()
        tb = buf(n + 64)
        case("tensor.get_into", lambda: st.get_tensor_into("t.t1", tb, n + 64))
        case("tensor.get_into_small", lambda: st.get_tensor_into("t.t1", tb, 8))
        case("tensor.put_from", lambda: st.put_tensor_from("t.tf", tb, n))
        case("tensor.put_from_get", lambda: st.get_tensor("t.tf"))
        case("tensor.upsert_from", lambda: st.upsert_tensor_from("t.tf3", tb, n))
        case(
            "tensor.batch_get_into",
            lambda: st.batch_get_tensor_into(["t.t1", "t.missing"], [tb, tb], [n + 64, n + 64]),
        )
        case("tensor.batch_put_from", lambda: st.batch_put_tensor_from(["t.tf2"], [tb], [n]))
        case("tensor.batch_upsert_from", lambda: st.batch_upsert_tensor_from(["t.tf2"], [tb], [n]))
        case("tensor.serialize", lambda: [len(ms._serialize_tensor(t)), ms._serialize_tensor(t)[2]])
        case("tensor.deserialize", lambda: ms._deserialize_tensor(st.get("t.t1")))
        case("tensor.raw_len", lambda: len(st.get("t.t1")))

        def par() -> Any:
            tp = ms.TensorParallelism()
            ax = ms.ParallelAxis()
            return [ax.rank, ax.size, ax.split_dim, norm(ax.kind), len(tp.axes)]

        case("tensor.parallel_defaults", par)
        import tempfile

        d = tempfile.mkdtemp(prefix="mc_table_")
        f1, f2 = f"{d}/a.safetensors", f"{d}/b.safetensors"
        case("safetensor.save", lambda: st.save_tensor_to_safetensor("t.t1", f1))
        case("safetensor.load_positional", lambda: st.load_tensor_from_safetensor("t.st", f1))
        case("safetensor.get_loaded", lambda: st.get_tensor("t.st"))
        st.put("t.sk", b"old")  # load = put: an existing key keeps its value
        case("safetensor.load_onto_existing", lambda: st.load_tensor_from_safetensor("t.sk", f1))
        case("safetensor.existing_kept", lambda: st.get("t.sk"))
        case("safetensor.load_missing", lambda: st.load_tensor_from_safetensor("t.x", f"{d}/no"))
        case("safetensor.save_not_tensor", lambda: st.save_tensor_to_safetensor("t.k", f2))
        case("safetensor.save_missing_key", lambda: st.save_tensor_to_safetensor("t.missing", f2))
        case("safetensor.save_no_dir", lambda: st.save_tensor_to_safetensor("t.t1", f"{d}/no/c"))
        case("safetensor.no_file_name", lambda: st.load_tensor_from_safetensor("t.x"))
        case("tensor.par_put_none", lambda: st.put_tensor_with_parallelism("t.par", t))
        case("tensor.par_get_none", lambda: st.get_tensor_with_parallelism("t.par"))
        import table_parallel  # this script's directory is on sys.path

        table_parallel.run(ms, st, case, buf)
    # --- removal -----------------------------------------------------------------------------
    case("remove.miss", lambda: st.remove("t.missing"))
    st.put("t.r", b"v")
    case("remove.fresh", lambda: st.remove("t.r"))
    st.put("t.r", b"v")
    st.get("t.r")
    case("remove.leased", lambda: st.remove("t.r"))
    case("batch_remove", lambda: st.batch_remove(["t.r", "t.missing"]))
    case("remove.force", lambda: st.remove("t.r", force=True))
    case("remove.empty", lambda: st.remove(""))
    for i in range(3):
        st.put(f"t.x{i}", b"v")
    case("remove_by_regex", lambda: st.remove_by_regex("^t\\.x"))
    case("remove_by_regex.bad", lambda: st.remove_by_regex("("))
    case("remove_all.force", lambda: st.remove_all(force=True) > 0)
    case("remove_all.empty", lambda: st.remove_all())
    case("close", lambda: st.close())
    case("close.again", lambda: st.close())
    case("post.get", lambda: st.get("t.k"))
    case("post.health", lambda: st.health_check())
    return out


def main() -> int:
    master = sys.argv[1]
    metadata = sys.argv[2] if len(sys.argv) > 2 else "P2PHANDSHAKE"
    import mooncake.store as ms

    res = run_cases(ms, master, metadata)
    res["__module__"] = ms.__file__ is not None and (
        "kvcake" if "kvcake" in repr(ms.MooncakeDistributedStore) else "mooncake"
    )
    sys.stdout.write(json.dumps(res, indent=1, sort_keys=True) + "\n")
    sys.stdout.flush()
    import os

    os._exit(0)  # Mooncake's C++ threads can hang interpreter shutdown


if __name__ == "__main__":
    sys.exit(main())
