"""The one Prometheus text reader (kvcake.core.promtext) on text a registry really renders."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvcake.core.promtext import find, parse_metrics, total


def test_reads_what_a_registry_renders() -> None:
    r = CollectorRegistry()
    c = Counter("kvcake:reqs", "requests", ["kind"], registry=r)
    c.labels("a").inc(2)
    c.labels("b").inc(3)
    Gauge("kvcake_store_objects", "objects", registry=r).set(7)
    m = parse_metrics(generate_latest(r).decode())
    assert total(m, "kvcake:reqs_total") == 5.0  # counters under their sample names
    assert total(m, "kvcake:reqs_total", kind="b") == 3.0
    assert find(m, "kvcake_store_objects") == [({}, 7.0)]
    assert total(m, "absent") == 0.0 and find(m, "absent") == []


def test_text_that_is_not_prometheus_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_metrics("kvcake:x 1\nnot a metric line\n")
