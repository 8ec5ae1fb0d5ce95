"""docker-compose.yml and deploy/Dockerfile, checked against the code (no Docker engine runs here).

The compose file is read as Docker Compose reads it (YAML, merge keys, the image's entrypoint
before each command), and then:

- every command a service runs is a command of the ``teaagent`` CLI, with options it takes;
- the key-generation step (deploy/init-cluster.sh) is run for real, into a temporary folder in
  place of the ``/cluster`` volume, and every configuration a service names is one it generated
  and loads with ``load_config``, for the node the service is named after;
- the ports agree: each health check calls its own service's port from the configuration, the
  relay URLs name the relay services, ``redis_url`` the Valkey service;
- every health check calls ``/ready`` (readiness, not mere liveness), a real GET route of that
  service's application;
- services start in dependency order, each on the health of what it needs;
- the Dockerfile: a Python the project supports, the README's install step, the entrypoint a
  console script of pyproject.toml, every file the compose file runs copied into the image.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml

from teaagent.cli._main import build_app
from teaagent.config import NodeConfig, load_config

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
VOLUME = "/cluster"  # where the compose file mounts the generated configurations
NODES = ("alpha", "beta", "gamma")
KINDS = ("relay", "approver", "agent")

compose: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
SERVICES: dict[str, Any] = compose["services"]


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.append((word.upper(), rest.strip()))
    return instructions


def _instruction(name: str) -> list[str]:
    return [rest for word, rest in _dockerfile() if word == name]


def _entrypoint() -> list[str]:
    (entrypoint,) = _instruction("ENTRYPOINT")
    parsed: list[str] = yaml.safe_load(entrypoint)  # the JSON (exec) form
    return parsed


def _argv(service: dict[str, Any]) -> list[str]:
    """What the container runs: its entrypoint (the image's unless overridden), then its command."""
    entrypoint = service.get("entrypoint", _entrypoint())
    command = service.get("command", [])
    return [*entrypoint, *command]


def _teaagent_services() -> dict[str, dict[str, Any]]:
    return {name: service for name, service in SERVICES.items() if service.get("image") == "teaagent:local"}


def _cli_command(args: list[str]) -> tuple[Any, list[str]]:
    """Walk the teaagent command tree along ``args``; return the command reached and its arguments.

    Raises:
        LookupError: A word names no command of the CLI.
    """
    # typer carries a click of its own: a group is what lists commands, whichever click made it.
    command: Any = typer.main.get_command(build_app())
    rest = list(args)
    while hasattr(command, "list_commands") and rest and not rest[0].startswith("-"):
        found = command.get_command(command.context_class(command), rest[0])
        if found is None:
            raise LookupError(f"teaagent has no command {' '.join(args[: len(args) - len(rest) + 1])!r}")
        command = found
        rest.pop(0)
    return command, rest


def _check_cli(args: list[str]) -> None:
    command, rest = _cli_command(args)
    # Parsing the arguments (without running) refuses unknown options and wrong types.
    command.make_context("teaagent", rest)


# -- the commands -------------------------------------------------------------------------------


def test_every_node_has_its_three_services_and_one_valkey() -> None:
    expected = {f"{kind}-{node}" for kind in KINDS for node in NODES}
    assert expected <= set(_teaagent_services())
    assert set(SERVICES) == {"valkey", "init", *expected}


@pytest.mark.parametrize("kind", ["relay", "approver", "agent"])
def test_every_command_the_compose_file_runs_exists_in_the_cli(kind: str) -> None:
    for node in NODES:
        argv = _argv(SERVICES[f"{kind}-{node}"])
        assert argv[0] == "teaagent"
        assert argv[1:3] == [kind, "serve"]
        try:
            _check_cli(argv[1:])
        except LookupError as exc:
            pytest.fail(str(exc))


def test_the_key_generation_step_is_a_script_of_the_image_running_teaagent_init() -> None:
    argv = _argv(SERVICES["init"])
    assert argv[:1] == ["sh"]
    script = Path(argv[1])
    assert script.is_relative_to("/app")
    assert (ROOT / script.relative_to("/app")).is_file()
    commands = _script_commands()
    assert [command[:2] for command in commands] == [["teaagent", "init"]]
    _check_cli(commands[0][1:])


INIT_SCRIPT = ROOT / "deploy" / "init-cluster.sh"


def _with_defaults(text: str) -> str:
    """The script as it runs with none of its variables set: each ``${VAR:-default}`` its default."""
    return re.sub(r"\$\{[A-Z_]+:-((?:\\\}|[^}])*)\}", lambda m: m.group(1).replace("\\}", "}"), text)


def _script_commands() -> list[list[str]]:
    text = _with_defaults(re.sub(r"\\\n", " ", INIT_SCRIPT.read_text()))
    commands = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "exec":
            words = words[1:]
        if words and words[0] == "teaagent":
            commands.append(words)
    return commands


# -- the generated configurations ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The key-generation step run for real (the script, by sh), /cluster being a temporary folder."""
    folder = tmp_path_factory.mktemp("cluster")
    script = INIT_SCRIPT.read_text().replace(VOLUME, str(folder))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for name in ("TEAAGENT_HOST", "TEAAGENT_REDIS_URL", "TEAAGENT_BASE_PORT"):
        env.pop(name, None)
    done = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    # The step is idempotent: compose runs it at every `up`.
    before = {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    again = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert again.returncode == 0, again.stderr
    assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == before
    return folder


def _config_of(service: dict[str, Any], cluster: Path) -> NodeConfig:
    argv = _argv(service)
    path = Path(argv[argv.index("--config") + 1])
    assert path.is_relative_to(VOLUME), path
    return load_config(cluster / path.relative_to(VOLUME))


def _health_url(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD"
    urls = re.findall(r"https?://[^'\"\s]+", " ".join(test[1:]))
    assert len(urls) == 1, test
    return urls[0]


def _volume_targets(service: dict[str, Any]) -> dict[str, str]:
    return {entry.split(":")[1]: entry.split(":")[0] for entry in service.get("volumes", [])}


def test_every_configuration_a_service_names_is_generated_and_loads(cluster: Path) -> None:
    for name, service in _teaagent_services().items():
        if name == "init":
            continue
        node = name.split("-", 1)[1]
        config = _config_of(service, cluster)
        assert config.agent_id == node
        assert config.private_key is not None
        assert config.private_key.is_file()
        assert config.token_path.is_file()  # one token for the node's three containers


def test_a_nodes_secrets_are_mounted_in_that_nodes_containers_only(cluster: Path) -> None:
    """One volume per node: a node's services mount their own node's folder and nothing else."""
    for name, service in _teaagent_services().items():
        if name == "init":
            continue
        node = name.split("-", 1)[1]
        assert _volume_targets(service) == {f"{VOLUME}/{node}": node}, name
        # Everything the node reads of its own lies in its folder: key, token, data, workspace.
        config = _config_of(service, cluster)
        folder = cluster / node
        for path in (config.private_key, config.token_path, config.data_dir, config.workspace):
            assert path is not None
            assert path.resolve().is_relative_to(folder.resolve()), (name, path)
        # Its peers are public keys written inline, not files of their folders.
        assert all(settings.public_key.startswith("ssh-") for settings in config.peers.values())
    # The one-shot init step writes every node's folder; nothing else sees two nodes.
    assert _volume_targets(SERVICES["init"]) == {f"{VOLUME}/{node}": node for node in NODES}
    assert set(compose["volumes"]) == {*NODES, "valkey-data"}
    # Each folder is its node's alone inside the container, too.
    for node in NODES:
        assert (cluster / node).stat().st_mode & 0o777 == 0o700


def test_the_image_is_built_once_by_the_init_service() -> None:
    built = [name for name, service in SERVICES.items() if "build" in service]
    assert built == ["init"]
    for name, service in _teaagent_services().items():
        if name != "init":
            assert service.get("pull_policy") == "never", name


def test_each_health_check_calls_its_own_port_from_the_configuration(cluster: Path) -> None:
    for node in NODES:
        config = _config_of(SERVICES[f"relay-{node}"], cluster)
        relay_port = urlsplit(config.relay_url).port
        expected = {"relay": relay_port, "approver": config.approver.port, "agent": config.agent.port}
        for kind, port in expected.items():
            url = urlsplit(_health_url(SERVICES[f"{kind}-{node}"]))
            assert (url.hostname, url.port) == ("127.0.0.1", port), (kind, node)
        # The agent and approver listen on loopback in their own container: that is what they check.
        assert config.agent.host == "127.0.0.1"
        # The relay listens on every interface of its container, so its peers reach it.
        argv = _argv(SERVICES[f"relay-{node}"])
        assert argv[argv.index("--host") + 1] == "0.0.0.0"


def test_relay_urls_and_redis_name_services_of_the_compose_file(cluster: Path) -> None:
    for node in NODES:
        config = _config_of(SERVICES[f"relay-{node}"], cluster)
        own = urlsplit(config.relay_url)
        assert own.hostname == f"relay-{node}"
        assert own.hostname in SERVICES
        for peer, settings in config.peers.items():
            url = urlsplit(settings.relay_url)
            assert url.hostname == f"relay-{peer}"
            assert url.port == urlsplit(_health_url(SERVICES[f"relay-{peer}"])).port
        redis = urlsplit(config.redis_url)
        assert (redis.hostname, redis.port) == ("valkey", 6379)
        assert config.quorum.enabled
        assert config.quorum.required_approvals == 1


def _app_of(kind: str, config: NodeConfig) -> Any:
    if kind == "relay":
        from teaagent_relay import Settings, create_app
    elif kind == "approver":
        from teaagent_approver import Settings, create_app  # type: ignore[assignment]
    else:
        from teaagent_agent import Settings, create_app  # type: ignore[assignment]
    return create_app(Settings(config=str(config.path)))


@pytest.mark.parametrize("kind", ["relay", "approver", "agent"])
def test_every_health_check_calls_a_real_route(cluster: Path, kind: str) -> None:
    for node in NODES:
        service = SERVICES[f"{kind}-{node}"]
        path = urlsplit(_health_url(service)).path
        assert path == "/ready"
        application = _app_of(kind, _config_of(service, cluster))
        # The application's own OpenAPI document lists its routes (FastAPI includes routers lazily).
        paths = application.openapi()["paths"]
        assert "get" in paths.get(path, {}), f"{kind} has no GET {path}: {sorted(paths)}"


# -- order and health ----------------------------------------------------------------------------


def test_services_start_in_dependency_order_on_health() -> None:
    for node in NODES:
        relay = SERVICES[f"relay-{node}"]["depends_on"]
        assert relay == {
            "init": {"condition": "service_completed_successfully"},
            "valkey": {"condition": "service_healthy"},
        }
        assert SERVICES[f"approver-{node}"]["depends_on"] == {
            f"relay-{node}": {"condition": "service_healthy"}
        }
        assert SERVICES[f"agent-{node}"]["depends_on"] == {
            f"relay-{node}": {"condition": "service_healthy"},
            f"approver-{node}": {"condition": "service_healthy"},
        }
    for name, service in SERVICES.items():
        for needed, condition in service.get("depends_on", {}).items():
            if condition["condition"] == "service_healthy":
                assert "test" in SERVICES[needed]["healthcheck"], f"{name} waits on {needed}'s health"
        if name != "init":
            assert service["healthcheck"]["test"], name
        assert service.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_valkey_keeps_its_data_in_a_named_volume_and_fsyncs_every_write() -> None:
    valkey = SERVICES["valkey"]
    assert _volume_targets(valkey)["/data"] == "valkey-data"
    assert "valkey-data" in compose["volumes"]
    assert valkey["healthcheck"]["test"] == ["CMD", "valkey-cli", "ping"]
    command = valkey["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "always"


def test_nothing_is_published_on_the_host() -> None:
    assert not [name for name, service in SERVICES.items() if service.get("ports")]


# -- the Dockerfile ------------------------------------------------------------------------------


def test_the_base_image_is_a_debian_whose_python_the_project_supports() -> None:
    bases = _instruction("FROM")
    match = re.fullmatch(r"debian:(\w+)-slim AS base", bases[0])
    assert match, bases[0]
    python = {"bookworm": (3, 11), "trixie": (3, 13)}[match.group(1)]  # Debian's python3
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"
    assert python >= (3, 11)
    # Every later stage starts from it.
    assert [base.split()[0] for base in bases[1:]] == ["base", "base"]
    assert any("python3 python3-venv" in rest for rest in _instruction("RUN"))


def test_the_install_step_is_the_readmes_from_wheels_in_a_stage_of_its_own() -> None:
    installs = [rest for rest in _instruction("RUN") if "pip install" in rest]
    assert len(installs) == 1
    (install,) = installs
    # The project's wheel is built from the copied sources, then installed with no index at all.
    assert "pip wheel --quiet --find-links /wheelhouse --wheel-dir /wheelhouse /src" in install
    assert "pip install --quiet --no-cache-dir --no-index --find-links /wheelhouse teaagent" in install
    # The final image takes the installed environment only: no sources, build folder or wheels.
    final = _dockerfile()[max(i for i, (word, _) in enumerate(_dockerfile()) if word == "FROM") :]
    copies = [rest for word, rest in final if word == "COPY"]
    assert "--from=install /opt/teaagent /opt/teaagent" in copies
    assert not [rest for rest in copies if "libs" in rest or "services" in rest or "wheelhouse" in rest]
    readme = (ROOT / "README.md").read_text()
    assert "pip install ." in readme
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet -e '.[dev]'" in makefile
    assert "pip install -e '.[dev]'" in readme
    assert "pip wheel --quiet --wheel-dir deploy/wheelhouse ." in makefile


def test_the_entrypoint_is_the_projects_console_script() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert _entrypoint() == ["teaagent"]
    assert scripts["teaagent"] == "teaagent.cli:main"
    assert any("openssh-client" in rest for rest in _instruction("RUN"))  # ssh-keygen for init and signing
    (user,) = _instruction("USER")
    assert user not in ("root", "0")


def test_every_file_the_compose_file_runs_is_copied_into_the_image() -> None:
    (workdir,) = _instruction("WORKDIR")
    copied: dict[str, str] = {}  # destination in the image -> source in the build context
    for rest in _instruction("COPY"):
        if rest.startswith("--from="):
            continue  # from another stage of the build, not from the build context
        *sources, destination = rest.split()
        for source in sources:
            target = destination if not destination.endswith("/") else destination + Path(source).name
            image_path = target if target.startswith("/") else f"{workdir}/{target.removeprefix('./')}"
            copied[os.path.normpath(image_path)] = source
    for source in copied.values():
        assert (ROOT / source).exists(), source
        assert not _docker_ignored(source), f".dockerignore drops {source}"
    script = _argv(SERVICES["init"])[1]
    assert script in copied, f"{script} is not copied into the image"
    for package in ("libs", "services", "pyproject.toml", "README.md"):
        assert any(source == package for source in copied.values()), package


def _docker_ignored(source: str) -> bool:
    ignore = ROOT / ".dockerignore"
    patterns = [
        line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    return any(fnmatch.fnmatch(source, pattern.removeprefix("**/")) for pattern in patterns)


def test_the_readme_shows_the_compose_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docker compose up --build -d" in readme
    # Debian bookworm has Compose v1 only: its command is said too.
    assert "docker-compose up --build -d" in readme
    assert "docker-compose up --build -d" in (ROOT / "docs" / "deployment.md").read_text()
    assert (
        "docker compose exec approver-beta teaagent approvals list --config /cluster/beta/node.toml" in readme
    )
