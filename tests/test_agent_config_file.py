"""The agent service's writer of ``[models.NAME]`` tables: the rest of node.toml kept byte for byte,
the new file checked before it replaces the old one, a form it cannot rewrite refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_support import write_node

from teaagent.config import load_config
from teaagent.errors import ConfigError
from teaagent_agent._config_file import ModelsFileError, render_models, write_model_tables


def test_tables_are_added_changed_and_removed_and_the_rest_is_kept(tmp_path: Path) -> None:
    node = write_node(tmp_path)
    original = node.config_path.read_text() + "\n# a comment of the operator\n[approver]\nport = 8799\n"
    node.config_path.write_text(original)
    node.config_path.chmod(0o640)

    def add(tables: dict[str, dict[str, object]]) -> None:
        tables["gpt"] = {"model": "gpt-4.1", "token": 'quote " and \\ and \x7f', "reasoning_efforts": ["low"]}
        tables["local"] = {"model": "m", "base_url": "http://127.0.0.1:9/v1", "compact_percent": 55.5}

    config = write_model_tables(node.config_path, add)
    assert list(config.models) == ["gpt", "local"]
    assert config.models["gpt"].token == 'quote " and \\ and \x7f'
    assert config.models["local"].compact_percent == 55.5
    text = node.config_path.read_text()
    assert text.startswith(original.rstrip("\n"))
    assert node.config_path.stat().st_mode & 0o777 == 0o640

    config = write_model_tables(node.config_path, lambda tables: tables.pop("gpt"))
    assert list(config.models) == ["local"]
    # Tables written between others' tables are cut out wherever they are, and written at the end.
    assert "[approver]" in node.config_path.read_text()
    config = write_model_tables(node.config_path, lambda tables: tables.clear())
    assert config.models == {}
    assert node.config_path.read_text().rstrip("\n") == original.rstrip("\n")


def test_a_change_the_loader_refuses_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    node = write_node(tmp_path)
    before = node.config_path.read_text()

    def bad(tables: dict[str, dict[str, object]]) -> None:
        tables["x"] = {"model": "m", "context_window": 0}

    with pytest.raises(ConfigError, match=r"models\.x\.context_window must be at least 1 token, not 0"):
        write_model_tables(node.config_path, bad, label=str(node.config_path))
    assert node.config_path.read_text() == before
    assert not list(tmp_path.glob(".alpha.toml.*.tmp"))


def test_models_written_inline_are_refused_not_rewritten(tmp_path: Path) -> None:
    node = write_node(tmp_path)
    node.config_path.write_text(
        node.config_path.read_text().replace("[agent]", 'models = { a = { model = "m" } }\n\n[agent]')
    )
    assert list(load_config(node.config_path).models) == ["a"]
    before = node.config_path.read_text()
    with pytest.raises(
        ModelsFileError, match=r"its models are written in a form this service does not rewrite"
    ):
        write_model_tables(node.config_path, lambda tables: tables.clear())
    assert node.config_path.read_text() == before


def test_render_quotes_names_and_values() -> None:
    assert render_models({"a.b": {"model": "x", "multimodal": True, "context_window": 5}}) == (
        '[models."a.b"]\nmodel = "x"\nmultimodal = true\ncontext_window = 5\n'
    )
