"""teaagent.config: the ``[models.NAME]`` tables and ``[agent] host`` the agent service reads and writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_support import write_private_key

from teaagent.config import DEFAULT_AGENT_HOST, ModelSettings, load_config
from teaagent.errors import ConfigError

BASE = """\
agent_id = "alpha"
private_key = "keys/alpha"
relay_url = "http://127.0.0.1:8701"
"""


@pytest.fixture
def node_dir(tmp_path: Path) -> Path:
    write_private_key(tmp_path / "keys" / "alpha")
    return tmp_path


def write(node_dir: Path, extra: str) -> Path:
    path = node_dir / "alpha.toml"
    path.write_text(BASE + extra)
    return path


def test_no_models_table_means_no_models_and_a_loopback_agent(node_dir: Path) -> None:
    config = load_config(write(node_dir, ""))
    assert config.models == {}
    assert config.agent.host == DEFAULT_AGENT_HOST == "127.0.0.1"


def test_agent_host_is_read(node_dir: Path) -> None:
    assert load_config(write(node_dir, '[agent]\nhost = "0.0.0.0"\n')).agent.host == "0.0.0.0"


def test_models_are_read_in_file_order_with_their_provider(node_dir: Path) -> None:
    config = load_config(
        write(
            node_dir,
            """
[models.gpt]
model = "gpt-4.1"
token = "sk-test"
context_window = 128000
reasoning_efforts = ["low", "high"]

[models."claude"]
model = "claude-sonnet-4-5"
anthropic = true
compact_percent = 70

[models.local]
model = "qwen2.5-coder:7b"
base_url = "http://127.0.0.1:11434/v1/"
multimodal = true

[models.offline]
model = "scripted"
""",
        )
    )
    assert list(config.models) == ["gpt", "claude", "local", "offline"]
    gpt = config.models["gpt"]
    assert gpt == ModelSettings(
        name="gpt", model="gpt-4.1", token="sk-test", context_window=128000, reasoning_efforts=("low", "high")
    )
    assert "sk-test" not in repr(gpt)
    assert [model.provider for model in config.models.values()] == [
        "openai",
        "anthropic",
        "openai-compatible",
        "scripted",
    ]
    assert config.models["claude"].compact_percent == 70.0
    assert config.models["local"].base_url == "http://127.0.0.1:11434/v1"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[models.gpt]\ntoken = "x"\n', "the required key models.gpt.model is missing"),
        ('[models.gpt]\nmodel = "m"\ncolour = "red"\n', "unknown key models.gpt.colour"),
        (
            '[models.gpt]\nmodel = "m"\ncontext_window = 0\n',
            "models.gpt.context_window must be at least 1 token, not 0",
        ),
        (
            '[models.gpt]\nmodel = "m"\ncompact_percent = 101\n',
            "models.gpt.compact_percent must be above 0 and at most 100, not 101",
        ),
        (
            '[models.gpt]\nmodel = "m"\nbase_url = "ftp://x"\n',
            "models.gpt.base_url must be an http:// or https:// URL",
        ),
        (
            '[models.gpt]\nmodel = "m"\nreasoning_efforts = ["low", "low"]\n',
            "models.gpt.reasoning_efforts names an effort twice",
        ),
        ('[models.gpt]\nmodel = "m"\ntoken = " "\n', "models.gpt.token is empty"),
        ('[models."a b"]\nmodel = "m"\n', "models.a b is not a usable model name"),
        ('[agent]\nhost = ""\n', "agent.host is empty"),
    ],
)
def test_each_mistake_is_one_sentence(node_dir: Path, table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config(write(node_dir, table))
