"""Settings of one Transfer Engine (``[transfer]`` in a kvcake TOML file)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcake.core.config import require, size_field

PROTOCOLS = ("auto", "tcp", "shm")


@dataclass(frozen=True)
class TransferConfig:
    """Tunables. Sizes accept strings such as ``"1MiB"``.

    - ``slice_size``: large requests are cut into slices of at most this many bytes; slices of a
      batch are spread over ``streams`` connections and over every healthy path.
    - ``lane_bytes``: a batch opens one more parallel connection per this many bytes (so a batch
      of small requests stays on one pipelined connection, which is cheaper in Python). 16 MiB:
      on loopback with 2 vCPUs one connection moved 16 x 1 MiB batches 1.2-1.5x faster than
      two (docs/benchmarks.md); a host with several NICs per path tier stripes a batch over
      them only past this size, so lower it there.
    - ``window`` / ``window_bytes``: slices / bytes in flight per connection (pipelining: a
      lane sends ahead and reads replies as they come, so a batch costs few wake-ups).
    - ``max_endpoints``: cap on pooled connections per engine; idle ones are evicted by SIEVE.
    - ``io_timeout_s``: a connection that makes no progress for this long counts as broken.
    - ``probe_interval_s``: a broken path is retried (probed) no sooner than this.
    - ``max_peer_maps``: same-host peers' segment files mapped at once (LRU beyond that).
    - ``max_batches``: batches submitted and not yet collected; a finished batch nobody
      collects within ``batch_ttl_s`` is dropped (its id then reads as unknown).
    - ``busy_poll_us``: a reader that finds no input polls the socket without blocking for up
      to this long before it sleeps in ``recv``. A blocked thread's wake-up costs tens of µs on
      a VM whose idle vCPU has halted; a reply that lands within the window skips it (the same
      trade as Mooncake's polling workers and Linux ``busy_poll``). 0 disables.
    """

    protocol: str = "auto"
    slice_size: int = size_field("1MiB")
    lane_bytes: int = size_field("16MiB")
    streams: int = 2
    window: int = 64
    window_bytes: int = size_field("64MiB")
    max_endpoints: int = 64
    workers: int = 8
    io_timeout_s: float = 10.0
    connect_timeout_s: float = 2.0
    probe_interval_s: float = 0.5
    max_attempts: int = 4
    server_max_data: int = size_field("256MiB")
    busy_poll_us: float = 50.0
    max_peer_maps: int = 64
    max_batches: int = 4096
    batch_ttl_s: float = 60.0

    def __post_init__(self) -> None:
        require(self.protocol in PROTOCOLS, f"transfer.protocol must be one of {PROTOCOLS}")
        require(self.slice_size >= 4096, "transfer.slice_size must be >= 4096 bytes")
        require(
            self.slice_size <= self.server_max_data,
            "transfer.slice_size must not exceed transfer.server_max_data",
        )
        require(self.lane_bytes >= 1, "transfer.lane_bytes must be >= 1")
        require(1 <= self.streams <= 256, "transfer.streams must be in [1, 256]")
        require(1 <= self.window <= 4096, "transfer.window must be in [1, 4096]")
        require(self.window_bytes >= 1, "transfer.window_bytes must be >= 1")
        require(self.max_endpoints >= 1, "transfer.max_endpoints must be >= 1")
        require(self.workers >= 1, "transfer.workers must be >= 1")
        require(self.io_timeout_s > 0, "transfer.io_timeout_s must be > 0")
        require(self.connect_timeout_s > 0, "transfer.connect_timeout_s must be > 0")
        require(self.probe_interval_s >= 0, "transfer.probe_interval_s must be >= 0")
        require(self.max_attempts >= 1, "transfer.max_attempts must be >= 1")
        require(self.max_peer_maps >= 1, "transfer.max_peer_maps must be >= 1")
        require(self.max_batches >= 1, "transfer.max_batches must be >= 1")
        require(self.batch_ttl_s > 0, "transfer.batch_ttl_s must be > 0")
        require(0 <= self.busy_poll_us <= 10_000, "transfer.busy_poll_us must be in [0, 10000]")
