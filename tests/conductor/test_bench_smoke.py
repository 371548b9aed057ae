"""The benchmark script still runs (tiny sizes; the real figures come from `kvcake bench`)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "conductor_bench.py"


def test_conductor_bench_runs_small(tmp_path: Path) -> None:
    main = runpy.run_path(str(BENCH))["main"]
    out = tmp_path / "r.json"
    argv = ["--instances", "4", "--blocks", "8", "--unrelated", "10", "--decisions", "30"]
    assert main([*argv, "--index", "both", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["results"]
    assert len(rows) == 6  # five policies on PrefixIndex + global on KVIndex
    assert all(r["decisions"] == 30 and r["median_us"] > 0 for r in rows)
    by = {(r["index"], r["policy"]): r for r in rows}
    # Same seeds, same decisions: the two index types fetch equally often.
    assert (
        by[("PrefixIndex", "global-cache-aware")]["fetch_decisions"]
        == by[("KVIndex", "global-cache-aware")]["fetch_decisions"]
    )
