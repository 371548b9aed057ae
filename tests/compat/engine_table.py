"""The ``mooncake.engine.TransferEngine`` call table: two engines in one process (P2PHANDSHAKE,
TCP), good and bad inputs; run by kvcake's Python (shim on ``sys.path``) or the wheel's.

    PYTHON tests/compat/engine_table.py  ->  JSON on stdout
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

MB = 1024 * 1024


def run_cases(me: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def case(name: str, fn: Callable[[], Any]) -> Any:
        try:
            r = fn()
        except BaseException as exc:
            out[name] = f"EXC:{type(exc).__name__}"
            return None
        out[name] = r if isinstance(r, (int, str, bool, list, type(None))) else repr(r)
        return r

    case(
        "opcode", lambda: [int(me.TransferOpcode.Read), int(me.TransferOpcode.Write), str(me.Write)]
    )
    case("opcode_on_class", lambda: int(me.TransferEngine.TransferOpcode.Write))
    case("flags", lambda: [me.SUPPORT_CUDA, me.SUPPORT_EFA])
    a, b = me.TransferEngine(), me.TransferEngine()
    case("init.a", lambda: a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""))
    case("init.b", lambda: b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""))
    case("init.bad_arity", lambda: b.initialize("127.0.0.1", "P2PHANDSHAKE"))
    case("rpc_port", lambda: a.get_rpc_port() > 0 and a.get_rpc_port() != b.get_rpc_port())
    bn = f"127.0.0.1:{b.get_rpc_port()}"
    pa = a.allocate_managed_buffer(MB)
    pb = b.allocate_managed_buffer(MB)
    case("managed", lambda: [pa != 0, pb != 0])
    case("first_buffer", lambda: a.get_first_buffer_address(bn) != 0)
    case("write_bytes", lambda: a.write_bytes_to_buffer(pa, b"hello world", 11))
    case("read_bytes", lambda: a.read_bytes_from_buffer(pa, 11).decode())
    case("sync_write", lambda: a.transfer_sync_write(bn, pa, pb + 100, 11))
    case("sync_write.data", lambda: b.read_bytes_from_buffer(pb + 100, 11).decode())
    case("sync_read", lambda: a.transfer_sync_read(bn, pa + 500, pb + 100, 11))
    case("sync_read.data", lambda: a.read_bytes_from_buffer(pa + 500, 11).decode())
    case("sync_write.out_of_range", lambda: a.transfer_sync_write(bn, pa, pb + MB, 11))
    case("sync_write.bad_target", lambda: a.transfer_sync_write("127.0.0.1:1", pa, pb, 11))
    case("sync.opcode", lambda: a.transfer_sync(bn, pa, pb + 200, 5, me.TransferOpcode.Write))
    case("sync.opcode.data", lambda: b.read_bytes_from_buffer(pb + 200, 5).decode())
    case(
        "batch_write",
        lambda: a.batch_transfer_sync_write(bn, [pa, pa + 1], [pb, pb + 4096], [4, 4]),
    )
    case(
        "batch_write.data",
        lambda: [
            b.read_bytes_from_buffer(pb, 4).decode(),
            b.read_bytes_from_buffer(pb + 4096, 4).decode(),
        ],
    )
    case("batch_read", lambda: a.batch_transfer_sync_read(bn, [pa + 3000], [pb + 4096], [4]))
    case("batch_read.data", lambda: a.read_bytes_from_buffer(pa + 3000, 4).decode())
    case("batch.mismatch", lambda: a.batch_transfer_sync_write(bn, [pa], [pb, pb], [4]))
    bid = case("async_read.id", lambda: a.batch_transfer_async_read(bn, [pa + 2000], [pb], [4]))
    out["async_read.id"] = bool(bid)
    case("async_read.status", lambda: a.get_batch_transfer_status([bid]))
    case("async_read.data", lambda: a.read_bytes_from_buffer(pa + 2000, 4).decode())
    wid = a.batch_transfer_async_write(bn, [pa], [pb + 7000], [5])
    case("async_write.status", lambda: a.get_batch_transfer_status([wid]))
    case("async_write.data", lambda: b.read_bytes_from_buffer(pb + 7000, 5).decode())
    sid = a.transfer_submit_write(bn, pa, pb + 9000, 5)
    out["submit.id"] = sid > 0

    def poll() -> int:
        deadline = time.monotonic() + 10
        while (s := a.transfer_check_status(sid)) == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        return s

    case("submit.status", poll)
    case("submit.data", lambda: b.read_bytes_from_buffer(pb + 9000, 5).decode())
    raw = ctypes.create_string_buffer(b"unregistered", 12)
    case(
        "unregistered_local",
        lambda: a.transfer_sync_write(bn, ctypes.addressof(raw), pb + 20000, 12),
    )
    case("unregistered_local.data", lambda: b.read_bytes_from_buffer(pb + 20000, 12).decode())
    case(
        "notify",
        lambda: a.transfer_sync(
            bn, pa, pb, 4, me.TransferOpcode.Write, me.TransferNotify("n1", "m1")
        ),
    )
    case("get_notifies", lambda: [(n.name, n.msg) for n in b.get_notifies()])
    case("get_notifies.again", lambda: [(n.name, n.msg) for n in b.get_notifies()])
    case("probe.ok", lambda: a.send_probe(bn))
    case("probe.bad", lambda: a.send_probe("127.0.0.1:1"))
    reg = ctypes.create_string_buffer(4096)
    ra = ctypes.addressof(reg)
    case("register", lambda: b.register_memory(ra, 4096))
    case("write_to_registered", lambda: a.transfer_sync_write(bn, pa, ra + 10, 5))
    case("write_to_registered.data", lambda: reg.raw[10:15].decode())
    case("unregister", lambda: b.unregister_memory(ra))
    case("batch_register", lambda: b.batch_register_memory([ra], [4096]))
    case("batch_unregister", lambda: b.batch_unregister_memory([ra]))
    case("free", lambda: b.free_managed_buffer(pb, MB))
    case("free.again", lambda: b.free_managed_buffer(pb, MB))
    return out


def main() -> int:
    import mooncake.engine as me

    res = run_cases(me)
    res["__module__"] = "kvcake" if "kvcake" in repr(me.TransferEngine) else "mooncake"
    sys.stdout.write(json.dumps(res, indent=1, sort_keys=True) + "\n")
    sys.stdout.flush()
    os._exit(0)  # the wheel's C++ threads can hang interpreter shutdown


if __name__ == "__main__":
    sys.exit(main())
