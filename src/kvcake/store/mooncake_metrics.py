"""The master's pool figures under Mooncake's own metric names (``MasterMetricManager`` in
``mooncake-store/src/master_metric_manager.cpp``), next to kvcake's ``kvcake_store_*`` ones,
so dashboards and scripts written for a Mooncake master read a kvcake master unchanged.

Mooncake's counters that carry no ``_total`` suffix (``master_evicted_key_count``,
``master_evicted_size_bytes``) are exported as gauges holding the running total, so the
names stay exactly Mooncake's; ``master_put_start_failures_total`` is a counter. Read from the
state at scrape time (``MasterState.mooncake_gauges``, store/admin.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # for the annotation only: this module needs nothing of the state at import
    from kvcake.store.master_state import MasterState

_HELP = {
    "master_key_count": "Total number of keys managed by the master",
    "master_allocated_bytes": "Total memory bytes currently allocated across all segments",
    "master_total_capacity_bytes": "Total memory capacity across all mounted segments",
    "master_allocated_file_size_bytes": "Bytes currently allocated on the SSD (disk) tier",
    "master_total_file_capacity_bytes": "Capacity of the SSD (disk) tier",
    "master_active_clients": "Total number of active clients",
    "master_evicted_key_count": "Total number of keys evicted (running total)",
    "master_evicted_size_bytes": "Total bytes of evicted objects (running total)",
}


class MooncakeMasterCollector(Collector):
    def __init__(self, state: MasterState):
        self.state = state  # mooncake_gauges: store/admin.py

    def collect(self) -> Iterator[Metric]:
        g = self.state.mooncake_gauges()
        for name, doc in _HELP.items():
            m = GaugeMetricFamily(name, doc)
            m.add_metric([], float(g[name]))
            yield m
        c = CounterMetricFamily(
            "master_put_start_failures",
            "PutStart requests that failed to allocate space (even after evicting)",
        )
        c.add_metric([], float(g["master_put_start_failures"]))
        yield c
        for name, doc in (
            ("segment_allocated_bytes", "Memory bytes currently allocated of the segment"),
            ("segment_total_capacity_bytes", "Memory capacity of the mounted segment"),
        ):
            m = GaugeMetricFamily(name, doc, labels=["segment"])
            for seg, v in sorted(g[name].items()):
                m.add_metric([seg], float(v))
            yield m
