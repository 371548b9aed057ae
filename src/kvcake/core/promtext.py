"""The one reader of Prometheus text (what every ``/metrics`` serves): prometheus-client's parser,
its samples keyed by name and labels, and lookups by name and label values.

Counters appear under their sample names (``kvcake:prompt_tokens_total``), histograms as their
``_bucket`` / ``_sum`` / ``_count`` samples: a key names exactly one line of the text.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Series = dict[tuple[str, Labels], float]


def parse_metrics(text: str) -> Series:
    """Every sample of ``text``; ``ValueError`` when it is not Prometheus text."""
    out: Series = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def find(series: Series, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
    """``(labels, value)`` of the samples called ``name`` whose labels include ``match``."""
    out = []
    for (n, lbl), v in series.items():
        labels = dict(lbl)
        if n == name and all(labels.get(k) == x for k, x in match.items()):
            out.append((labels, v))
    return out


def total(series: Series, name: str, **match: str) -> float:
    """The sum of :func:`find`'s values (0 when none match)."""
    return sum(v for _, v in find(series, name, **match))
