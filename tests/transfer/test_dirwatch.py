"""DirectoryWatch: an engine's segments come back after the directory restarts or drops them."""

from __future__ import annotations

from kvcake.transfer import TransferEngine
from kvcake.transfer.dirwatch import DirectoryWatch
from kvcake.transfer.metadata import DirectoryClient, DirectoryService


def test_segments_are_published_again_after_a_directory_restart() -> None:
    first = DirectoryService("127.0.0.1", 0)
    first.start()
    port = int(first.address.rsplit(":", 1)[1])
    eng = TransferEngine(first.address)
    watch = DirectoryWatch(eng)
    try:
        eng.allocate_segment("kv/watched", 4096)
        assert watch.check() == 0  # listed: nothing to do
        boot = watch.boot
        assert boot == first.boot
        first.stop()
        second = DirectoryService("127.0.0.1", port)  # restarted, empty, same address
        second.start()
        try:
            reader = DirectoryClient(second.address)
            assert watch.check() == 1 and watch.boot == second.boot != boot
            assert reader.lookup("kv/watched").owner == eng.owner
            second.backend.delete_owner(eng.owner)  # dropped (e.g. the master thought us dead)
            assert watch.check() == 1
            assert reader.lookup("kv/watched").owner == eng.owner
            assert watch.check() == 0
            reader.close()
        finally:
            second.stop()
    finally:
        watch.close()
        eng.close()
