"""The LLM provider's model, base URL and script from node.toml (``[agent] model``, ``base_url``, ``script``).

Environment variables alone could not say where a node's prompts go; the configuration can, and
wins over ``*_BASE_URL``. ``teaagent run`` is checked against a stand-in OpenAI-compatible server on
a real socket: the request reaches the configured URL, naming the configured model.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import SSHKey

from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.errors import ConfigError
from teaagent.llm import create_llm_adapter

FIXTURES = Path(__file__).parent / "fixtures" / "llm"


@pytest.fixture
def write(tmp_path: Path, ssh_key_factory: Callable[..., SSHKey]) -> Callable[[str], Path]:
    key = ssh_key_factory("alpha")

    def make(agent: str) -> Path:
        path = tmp_path / "node.toml"
        path.write_text(
            f'agent_id = "alpha"\nprivate_key = "{key.private_path}"\nrelay_url = "http://127.0.0.1:8701"\n'
            f'workspace = "ws"\n[agent]\npermission_mode = "read-only"\n{agent}'
        )
        (tmp_path / "ws").mkdir(exist_ok=True)
        return path

    return make


def test_agent_model_and_base_url_are_read(write: Callable[[str], Path]) -> None:
    config = load_config(
        write('provider = "openai-compatible"\nmodel = "qwen3:8b"\nbase_url = "http://gpu.lan:11434/v1/"\n')
    )

    assert config.agent.provider == "openai-compatible"
    assert config.agent.model == "qwen3:8b"
    assert config.agent.base_url == "http://gpu.lan:11434/v1"


def test_agent_script_is_a_bundled_name_or_a_file_beside_node_toml(write: Callable[[str], Path]) -> None:
    named = load_config(write('script = "quorum"\n'))
    filed = load_config(write('script = "scripts/mine.json"\n'))
    here = load_config(write('script = "./quorum"\n'))

    assert named.agent.script == "quorum"
    assert filed.agent.script == str(filed.path.parent / "scripts" / "mine.json")
    assert here.agent.script == str(here.path.parent / "quorum")
    assert load_config(write("")).agent.script is None


def test_without_them_the_provider_defaults_hold(write: Callable[[str], Path]) -> None:
    config = load_config(write('provider = "anthropic"\n'))

    assert (config.agent.model, config.agent.base_url) == (None, None)


@pytest.mark.parametrize(
    ("agent", "sentence"),
    [
        ('provider = "openai"\nmodel = " "\n', r"agent\.model is empty\."),
        (
            'provider = "openai"\nbase_url = "gpu.lan:11434"\n',
            r"agent\.base_url must be an http:// or https:// URL, not 'gpu\.lan:11434'\.",
        ),
        (
            'base_url = "http://gpu.lan/v1"\n',
            r"agent\.base_url is set, but provider 'scripted' calls no server\.",
        ),
        ('script = " "\n', r"agent\.script is empty\."),
        (
            'provider = "openai"\nscript = "quorum"\n',
            r"agent\.script is set, but provider 'openai' plays no script\.",
        ),
    ],
)
def test_bad_values_are_one_sentence(write: Callable[[str], Path], agent: str, sentence: str) -> None:
    with pytest.raises(ConfigError, match=rf": {sentence}$"):
        load_config(write(agent))


def test_the_configured_base_url_wins_over_the_variable() -> None:
    environ = {"OPENAI_COMPATIBLE_BASE_URL": "http://from-the-environment/v1"}

    configured = create_llm_adapter("openai-compatible", "m", environ=environ, base_url="http://gpu.lan/v1/")
    unset = create_llm_adapter("openai-compatible", "m", environ=environ)

    assert configured.base_url == "http://gpu.lan/v1"  # type: ignore[attr-defined]
    assert unset.base_url == "http://from-the-environment/v1"  # type: ignore[attr-defined]


def test_a_base_url_for_the_scripted_provider_or_not_http_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"^the scripted provider calls no server, so it takes no base URL\.$"
    ):
        create_llm_adapter("scripted", base_url="http://x")
    with pytest.raises(ConfigError, match=r"^the base URL must be an http or https URL, not 'x:1'\.$"):
        create_llm_adapter("openai-compatible", base_url="x:1")


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, Any]]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, body))  # type: ignore[attr-defined]
        if body.get("stream"):
            payload = (FIXTURES / "openai_text_stream.sse").read_bytes()
            kind = "text/event-stream"
        else:
            payload = (FIXTURES / "openai_text.json").read_bytes()
            kind = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def llm_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_teaagent_run_calls_the_configured_model_at_the_configured_url(
    write: Callable[[str], Path], llm_server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = llm_server.server_address[1]
    # The variable points elsewhere: the configuration must win.
    monkeypatch.setenv("OPENAI_COMPATIBLE_BASE_URL", "http://127.0.0.1:1/v1")
    config = write(
        f'provider = "openai-compatible"\nmodel = "coder-from-node-toml"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
    )

    code = run(["run", "--config", str(config), "--json", "say hello"])

    seen: list[tuple[str, dict[str, Any]]] = llm_server.seen  # type: ignore[attr-defined]
    assert code == 0
    assert seen, "no request reached the configured base URL"
    assert seen[0][0] == "/v1/chat/completions"
    assert seen[0][1]["model"] == "coder-from-node-toml"


def test_the_agent_services_builtin_model_is_the_configured_one(write: Callable[[str], Path]) -> None:
    from teaagent_agent._catalog import models_of

    node = load_config(
        write('provider = "openai-compatible"\nmodel = "qwen3:8b"\nbase_url = "http://gpu.lan/v1"\n')
    )

    builtin = models_of(node)[0]
    assert (builtin.name, builtin.model, builtin.base_url) == (
        "openai-compatible",
        "qwen3:8b",
        "http://gpu.lan/v1",
    )
    assert builtin.environment()["OPENAI_COMPATIBLE_BASE_URL"] == "http://gpu.lan/v1"


def test_teaagent_run_plays_the_configured_script_which_the_option_overrides(
    write: Callable[[str], Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAAGENT_LLM_SCRIPT", "denied")  # the file wins over the variable
    config = write('script = "question"\n')

    assert run(["run", "--config", str(config), "Clean up."]) == 0
    asked = capsys.readouterr().out
    assert run(["run", "--config", str(config), "--script", "demo", "List."]) == 0
    listed = capsys.readouterr().out

    assert "? Shall I clean the build folder?" in asked
    assert "(declined)" in asked
    assert "Thank you: your answer is in the ask_user result above" in asked
    assert "→ fs.list" in listed
    assert "ask_user" not in listed


def test_an_unknown_script_name_exits_2_naming_the_bundled_ones(
    write: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["run", "--config", str(write("")), "--script", "qourum", "Go."]) == 2
    assert capsys.readouterr().err == (
        "teaagent: There is no script file 'qourum' and no bundled script of that name; the bundled "
        "scripts are demo, quorum, denied, question.\n"
    )


def test_the_agent_services_builtin_model_plays_the_configured_script(write: Callable[[str], Path]) -> None:
    from teaagent.llm import ScriptedAdapter
    from teaagent_agent._catalog import make_adapter, models_of

    builtin = models_of(load_config(write('script = "quorum"\n')))[0]
    played = make_adapter(builtin, script_path=None)
    overridden = make_adapter(builtin, script_path="question")

    assert builtin.script == "quorum"
    assert isinstance(played, ScriptedAdapter)
    assert isinstance(overridden, ScriptedAdapter)
    assert (played.source, overridden.source) == ("quorum (bundled)", "question (bundled)")
