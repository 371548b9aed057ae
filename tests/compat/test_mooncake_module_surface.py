"""What the wheel's Python package ships and users import, through the switch: the module
names, the structured store's private helpers Mooncake's own suites import, and replica
descriptors naming the segment as Mooncake's do (values probed on the 0.3.13.post1 wheel)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvcake.compat.mooncake import shim
from kvcake.core.ports import free_port
from tests.store.conftest import Factory

PROBE = """
import torch
import mooncake.async_store as a, mooncake.structured_object_store as s
c = s._choose_leaf_codec
print(a.MooncakeDistributedStoreAsync.__mro__[1].__module__)
print(c([torch.tensor([1]), torch.tensor([2, 3])]).codec, c([object()]).codec,
      c([{"ok": 1}] * 200 + [object()]).accepted, c([]).accepted, c([1, 2.0, 3]).codec,
      c(["a", None]).codec, s._escape_key("a[0]"), s._escape_key("a.b"))
"""


def test_modules_through_the_switch(tmp_path: Path) -> None:
    shim.install(tmp_path)
    out = subprocess.run([sys.executable, "-c", PROBE], env={"PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    # the wheel's answers (0.3.13.post1, 2026-12-06) for the same calls
    assert out.stdout.split("\n")[:2] == [
        "kvcake.compat.mooncake.store",
        "ragged_tensor msgpack_ragged False False ndarray utf8_ragged a\\[0] a\\.b",
    ]


def test_replica_endpoint_is_the_segment_name(procs: Factory) -> None:
    from kvcake.compat.mooncake.store import MooncakeDistributedStore

    master = procs("master", "--port", "0", "--http-port", "0", "--client-ttl-s", "1")
    name = f"localhost:{free_port()}"  # as Mooncake's suites name their stores
    s = MooncakeDistributedStore()
    assert s.setup(name, "P2PHANDSHAKE", 16 << 20, 8 << 20, "tcp", "", master.info["rpc"]) == 0
    try:
        assert s.put("k", b"value") == 0
        (replica,) = s.get_replica_desc("k")
        desc = replica.get_memory_descriptor().buffer_descriptor
        assert desc.transport_endpoint == name == s.get_hostname()
        assert (
            s.batch_get_replica_desc(["k"])["k"][0]
            .get_memory_descriptor()
            .buffer_descriptor.transport_endpoint
            == name
        )
    finally:
        s.close()
