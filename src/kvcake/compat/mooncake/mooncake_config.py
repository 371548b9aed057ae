"""``mooncake.mooncake_config``: the wheel's ``MooncakeConfig`` (the settings most Mooncake
integrations and scripts read before ``setup()``), with the wheel's sources and rules: a JSON
file named by ``MOONCAKE_CONFIG_PATH``, else ``MOONCAKE_*`` environment variables (which need
``MOONCAKE_MASTER``). Sizes take Mooncake's binary suffixes (``"4GB"`` is 4 GiB, as in the
wheel, unlike kvcake's own ``parse_size``); the protocol is lower-cased and an unknown one only
warns (the store decides what it accepts); empty required fields and negative sizes raise
``ValueError``."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB, the wheel's defaults
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB
# tcp/rdma and the wheel's other transports, plus kvcake's own auto/shm.
KNOWN_PROTOCOLS = frozenset({
    "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex", "cxl",
    "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only", "auto", "shm",
})  # fmt: skip
REQUIRED = ("local_hostname", "metadata_server", "master_server_address")
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_TRUE = {"true", "1", "yes", "on", "enable"}
_FALSE = {"false", "0", "no", "off", "disable", ""}


def parse_segment_size(value: Any) -> int:
    """``4096``, ``"512MB"``/``"512m"`` (MiB), ``"1.5 GB"``; anything else: ``ValueError``."""
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return int(value)
    m = _SIZE.match(value)
    if not m:
        try:
            return int(float(value))  # "1e9", "-1" (the latter then fails validation)
        except ValueError:
            pass
        raise ValueError(f"Invalid segment size: {value!r} (bytes, or a number with KB/MB/GB/TB)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " "))


def parse_bool(value: Any) -> bool:
    """Booleans as config files and environments spell them; anything else: ``ValueError``."""
    if isinstance(value, (bool, int, float)) or value is None:
        return bool(value)
    s = str(value).strip().lower()
    if s in _TRUE or s in _FALSE:
        return s in _TRUE
    raise ValueError(f"Invalid boolean value: {value!r}")


_parse_segment_size, _parse_bool = parse_segment_size, parse_bool  # the wheel's names


@dataclass
class MooncakeConfig:
    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: str | None
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"Invalid protocol: {self.protocol!r} (e.g. 'tcp')")
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in KNOWN_PROTOCOLS:
            log.warning("Unrecognised protocol %r; passed through to the store", self.protocol)
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"Invalid {name}: {getattr(self, name)} (must be >= 0)")
        for name in REQUIRED:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Config field {name!r} must be a non-empty string, got {value!r}")

    @staticmethod
    def from_file(file_path: str) -> MooncakeConfig:
        with open(file_path) as fh:
            cfg = json.load(fh)
        for name in REQUIRED:
            if name not in cfg:
                raise ValueError(f"Missing required config field: {name}")
        return MooncakeConfig._from(lambda k, d: cfg.get(k, d), "device_name")

    @staticmethod
    def load_from_env() -> MooncakeConfig:
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        if not os.getenv("MOONCAKE_MASTER"):
            raise ValueError(
                "Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor 'MOONCAKE_MASTER' "
                "is set."
            )
        env = {
            "local_hostname": "MOONCAKE_LOCAL_HOSTNAME", "protocol": "MOONCAKE_PROTOCOL",
            "metadata_server": "MOONCAKE_TE_META_DATA_SERVER", "device": "MOONCAKE_DEVICE",
            "global_segment_size": "MOONCAKE_GLOBAL_SEGMENT_SIZE",
            "local_buffer_size": "MOONCAKE_LOCAL_BUFFER_SIZE",
            "master_server_address": "MOONCAKE_MASTER",
            "enable_ssd_offload": "MOONCAKE_OFFLOAD_ENABLED",
            "ssd_offload_path": "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
            "tenant_id": "MOONCAKE_TENANT_ID",
            "enable_client_http_server": "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER",
            "client_http_port": "MOONCAKE_CLIENT_HTTP_PORT",
        }  # fmt: skip
        defaults = {"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE"}
        return MooncakeConfig._from(lambda k, d: os.getenv(env[k], defaults.get(k, d)), "device")

    @staticmethod
    def _from(get: Any, device_key: str) -> MooncakeConfig:
        path, tenant = get("ssd_offload_path", None), get("tenant_id", None)
        return MooncakeConfig(
            local_hostname=get("local_hostname", None),
            metadata_server=get("metadata_server", None),
            global_segment_size=parse_segment_size(
                get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)
            ),
            local_buffer_size=parse_segment_size(
                get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)
            ),
            protocol=get("protocol", "tcp"),
            device_name=get(device_key, ""),
            master_server_address=get("master_server_address", None),
            enable_ssd_offload=parse_bool(get("enable_ssd_offload", False)),
            ssd_offload_path="" if path is None else str(path),
            tenant_id="default" if tenant is None else str(tenant),
            enable_client_http_server=parse_bool(get("enable_client_http_server", False)),
            client_http_port=int(get("client_http_port", 9300)),
        )
