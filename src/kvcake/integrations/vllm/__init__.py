"""kvcake as a vLLM V1 KV connector (docs/integrations/vllm.md).

Select it with::

    --kv-transfer-config '{"kv_connector": "KvcakeConnector",
                           "kv_connector_module_path": "kvcake.integrations.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"master": "127.0.0.1:50051"}}'

``KvcakeConnector`` is imported lazily so that the pure parts (``config``, ``keys``, ``plan``)
load without vLLM installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KvcakeConnector"]


def __getattr__(name: str) -> Any:
    if name == "KvcakeConnector":
        # lazy: optional dependency (vllm: the connector imports it; config, keys, plan load without it)
        from kvcake.integrations.vllm.connector import KvcakeConnector

        return KvcakeConnector
    raise AttributeError(name)
