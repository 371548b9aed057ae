"""Files shipped inside the package (the bundled trace sample)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SAMPLE_TRACE_NAME = "conversation_sample.jsonl"


def sample_trace_path() -> Path:
    """The first 3,500 requests of the Mooncake conversation trace (see data/README.md)."""
    return Path(str(resources.files("kvcake") / "data" / SAMPLE_TRACE_NAME))
