from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvcake.core.config import KVLayoutConfig, load_config, parse_size, require, size_field
from kvcake.core.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16MB", 16_000_000),
        ("16MiB", 16 * 2**20),
        ("1gib", 2**30),
        ("4096", 4096),
        (" 2 KB", 2000),
        (512, 512),
        ("1.5GB", 1_500_000_000),
        ("10b", 10),
    ],
)
def test_parse_size(text: str | int, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["50%", "-1", "x", "", "1XB", -5, True])
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ConfigError):
        parse_size(bad)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Inner:
    depth: int = 1


@dataclass(frozen=True)
class Sample:
    name: str = "a"
    port: int = 1
    ratio: float = 0.5
    fast: bool = False
    segment: int = size_field("1MB")
    hosts: tuple[str, ...] = ()
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self) -> None:
        require(0 < self.port < 65536, f"port must be in 1..65535, got {self.port}")


def test_precedence(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[svc]\nname = "toml"\nport = 10\nsegment = "2MB"\n[svc.inner]\ndepth = 3\n')
    env = {"KVCAKE_SVC_PORT": "20", "KVCAKE_SVC_FAST": "yes", "KVCAKE_SVC_HOSTS": "a,b"}
    cfg = load_config(
        Sample, toml_path=f, section="svc", env=env, overrides={"ratio": 0.9, "name": None}
    )
    assert cfg == Sample("toml", 20, 0.9, True, 2_000_000, ("a", "b"), Inner(3))


def test_defaults_and_frozen() -> None:
    cfg = load_config(Sample, env={})
    assert cfg == Sample()
    with pytest.raises(AttributeError):
        cfg.port = 3  # type: ignore[misc]


def test_errors_are_actionable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown setting.*prot.*valid"):
        load_config(Sample, env={}, overrides={"prot": 1})
    with pytest.raises(ConfigError, match="port must be in"):
        load_config(Sample, env={}, overrides={"port": 0})
    with pytest.raises(ConfigError, match="cannot use 'abc' as int"):
        load_config(Sample, env={"KVCAKE_PORT": "abc"})
    with pytest.raises(ConfigError, match="cannot use 'maybe' as bool"):
        load_config(Sample, env={"KVCAKE_FAST": "maybe"})
    bad = tmp_path / "bad.toml"
    bad.write_text("port = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(Sample, toml_path=bad, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Sample, toml_path=tmp_path / "missing.toml", env={})


def test_kv_layout_validation() -> None:
    assert KVLayoutConfig().kv_block_tokens == 32
    with pytest.raises(ConfigError, match="kv_block_tokens"):
        KVLayoutConfig(kv_block_tokens=0)
    with pytest.raises(ConfigError, match="dtype"):
        KVLayoutConfig(dtype="int3")
    with pytest.raises(ConfigError, match="'/'"):
        KVLayoutConfig(model="a/b")
