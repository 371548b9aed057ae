"""Where the processes of a nemesis run live: network namespaces (:class:`kvcake.launch.netns.
Network`, root only) on one bridge, partitions being per-pair ``drop`` rules in an nftables
``bridge`` table of the switch namespace (so a leader can be cut off from etcd and nothing
else); or, without namespaces or ``nft``, plain 127.0.0.1 and no partitions."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from kvcake.launch.netns import Network, sh, unavailable

ROOT = Path(__file__).resolve().parents[2]


def netns_unavailable() -> str:
    """Why partitions cannot run here ("" = they can)."""
    why = unavailable()
    if not why and shutil.which("nft") is None:
        why = "nft is not installed (apt-get install nftables)"
    return why


class Hosts:
    """Where processes run: namespaces with per-pair partitions, or plain loopback."""

    def __init__(self, roles: list[str], netns: bool):
        self.net = Network(roles) if netns else None
        self.cuts: set[tuple[str, str]] = set()

    def __enter__(self) -> Hosts:
        if self.net is not None:
            self.net.create()
            self._nft("add table bridge nemesis")
            self._nft("add chain bridge nemesis cut "
                      "{ type filter hook forward priority 0 ; policy accept ; }")  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        if self.net is not None:
            self.net.close()

    def addr(self, role: str) -> str:
        return self.net[role].addr if self.net is not None else "127.0.0.1"

    def command(self, role: str, argv: list[str]) -> list[str]:
        return self.net.command(role, argv) if self.net is not None else argv

    def env(self, secret: str) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        if self.net is not None:  # non-loopback binds need the shared secret
            env.update(self.net.env(), KVCAKE_AUTH_SECRET=secret)
        return env

    @contextlib.contextmanager
    def inside(self, role: str) -> Iterator[None]:
        if self.net is None:
            yield
        else:
            with self.net.inside(role):
                yield

    def _nft(self, rule: str) -> None:
        assert self.net is not None
        sh("ip", "netns", "exec", self.net.switch, "nft", rule)

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts ``a`` and ``b`` (both ways, silently)."""
        if self.net is None:
            raise RuntimeError("partitions need network namespaces")
        for x, y in ((a, b), (b, a)):
            self._nft(f"add rule bridge nemesis cut ip saddr {self.addr(x)} "
                      f"ip daddr {self.addr(y)} drop")  # fmt: skip
        self.cuts.add((a, b))

    def heal(self) -> None:
        if self.net is not None and self.cuts:
            self._nft("flush chain bridge nemesis cut")
        self.cuts.clear()
