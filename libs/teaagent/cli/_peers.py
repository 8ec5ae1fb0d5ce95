"""``teaagent peers add``: add a peer to node.toml without editing TOML by hand.

The file is edited with tomlkit, so its comments, order and layout stay as the user wrote them;
the result is checked with :func:`~teaagent.config.load_config` (from a temporary file beside
it, so relative paths resolve alike) before it replaces the file atomically. A file that does not
load is never touched.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Final

import httpx
import tomlkit
import typer
from tomlkit.items import Table

from teaagent._files import atomic_write, expand_home
from teaagent._words import needed_from
from teaagent.cli._exit import bad_usage
from teaagent.cli._options import ConfigOption
from teaagent.config import CONFIG_ENV_VAR, NodeConfig, load_config
from teaagent.errors import ConfigError, SignatureError
from teaagent.policy import AGENT_ID_PATTERN, PermissionMode
from teaagent.signing import fingerprint, parse_public_key

__all__ = ["add", "add_operator", "app", "edit_peers", "operators_app", "reload_services"]

app = typer.Typer(help="This node's peers, in its node.toml.", no_args_is_help=True)
operators_app = typer.Typer(
    help="Keys that may sign for this node besides its node key.", no_args_is_help=True
)
OPERATORS_FILE = "operators.allowed_signers"
OPERATOR_NAMESPACES = "teaagent-approval,teaagent-denial"  # an operator key decides; it never asks

DEFAULT_HIGH_RISK_PATTERNS = ("shell.*", "fs.delete")


def _config_path(config: Path | None) -> Path:
    if config is not None:
        return config
    from_env = os.environ.get(CONFIG_ENV_VAR, "")
    if not from_env:
        bad_usage(f"no configuration file was given: pass --config PATH or set {CONFIG_ENV_VAR}.")
    return Path(from_env)


def _is_private_key(text: str) -> bool:
    """Whether ``text`` is (or holds) a private key: OpenSSH's or PEM's armour."""
    return "PRIVATE KEY-----" in text or "openssh-key-v1" in text


def _key_line(key: str) -> str:
    """The public key line: KEY itself, or the first key line of the file KEY names.

    A private key (pasted, or the file KEY names) is refused without its content in the sentence.

    Raises:
        typer.Exit: Exit code 2: KEY is a private key, names a file that does not exist or cannot
            be read, or is not a usable SSH public key.
    """
    line = key.strip()
    if _is_private_key(line):
        bad_usage(
            "that is a private key; give its public half "
            "(the .pub file, or the line ssh-keygen -y -f KEY prints)."
        )
    if not line.startswith(("ssh-", "ecdsa-", "sk-")):
        candidate = expand_home(line)
        try:
            found, folder = candidate.exists(), candidate.is_dir()
        except OSError:  # no file can have that name (too long: a pasted key's bare base64...)
            found = folder = False
        if folder:
            bad_usage(f"{candidate} is a folder, not a public key file.")
        if not found and not any(space in line for space in " \t"):
            bad_usage(
                f"the key file {candidate} does not exist; give a public key file (NAME.pub) or the "
                "key's line ('ssh-ed25519 AAAA...')."
            )
        if found:
            try:
                text = candidate.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "it is not UTF-8 text"
                bad_usage(f"the key file {candidate} cannot be read: {str(why).rstrip('.').lower()}.")
            if _is_private_key(text):
                bad_usage(
                    f"{candidate} is a private key; give its public half ({candidate}.pub, or the line "
                    f"ssh-keygen -y -f {candidate} prints)."
                )
            lines = [each.strip() for each in text.splitlines() if each.strip() and not each.startswith("#")]
            if not lines:
                bad_usage(f"the key file {candidate} holds no public key line.")
            line = lines[0]
    try:
        parse_public_key(line)
    except SignatureError as exc:
        bad_usage(f"the key is not a usable SSH public key (a line such as 'ssh-ed25519 AAAA...'): {exc}")
    return line


def _check(path: Path, text: str) -> NodeConfig:
    """Load ``text`` as if it were ``path``: from a temporary file in the same folder.

    Raises:
        ConfigError: The edited configuration does not load (the sentence names ``path``).
    """
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".check", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        try:
            return load_config(temp_name)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(temp_name, str(path))) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)


def edit_peers(
    text: str,
    name: str,
    line: str,
    url: str,
    *,
    replace: bool = False,
    quorum: int | None = None,
    operator_keys: Sequence[str] = (),
    permission_mode: str | None = None,
) -> str:
    """Return node.toml's ``text`` with ``[peers.NAME]`` added (or, with ``replace``, updated).

    Comments and layout are kept; a new table goes after the existing peers. ``operator_keys``
    become the peer's ``public_keys`` (keys of its operators, which count as the peer).

    Raises:
        ValueError: ``peers`` is not a table of tables, or ``peers.NAME`` exists and not ``replace``.
    """
    document = tomlkit.parse(text)
    peers: Any = document.get("peers")
    if peers is None:
        peers = tomlkit.table(is_super_table=True)
        document.append("peers", peers)
    elif not isinstance(peers, Table):
        raise ValueError("peers is not a table of [peers.NAME] tables; edit it by hand")
    if name in peers:
        if not replace:
            raise ValueError(f"peers.{name} already exists: pass --replace to give it this key and URL")
        peers[name]["public_key"] = line
        peers[name]["relay_url"] = url
        if operator_keys:
            peers[name]["public_keys"] = list(operator_keys)
    else:
        table = tomlkit.table()
        table.add("public_key", line)
        if operator_keys:
            table.add("public_keys", list(operator_keys))
        table.add("relay_url", url)
        table.add(tomlkit.nl())  # a blank line before whatever table follows
        peers.append(name, table)
    if quorum is not None:
        section: Any = document.get("quorum")
        if section is None:
            section = tomlkit.table()
            document.append("quorum", section)
        enabled = tomlkit.item(True)
        enabled.comment("a high-risk call runs only after required_approvals peers have signed it")
        section["enabled"] = enabled
        section["required_approvals"] = quorum
        if "high_risk_patterns" not in section:
            section["high_risk_patterns"] = list(DEFAULT_HIGH_RISK_PATTERNS)
    if permission_mode is not None:
        agent: Any = document.get("agent")
        if agent is None:
            agent = tomlkit.table()
            document.append("agent", agent)
        agent["permission_mode"] = permission_mode
    return tomlkit.dumps(document)


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The peer's agent id.")],
    key: Annotated[
        str | None,
        typer.Argument(
            help="Its node key: a public key line, or its .pub file (with --replace: kept when omitted)."
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Argument(help="Its relay's URL, https:// across hosts (with --replace: kept when omitted)."),
    ] = None,
    config: ConfigOption = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Give an existing peer this key and URL.")
    ] = False,
    quorum: Annotated[
        int | None,
        typer.Option("--quorum", help="Also turn the quorum on, with this many approvals required."),
    ] = None,
    permission_mode: Annotated[
        str | None,
        typer.Option(
            "--permission-mode",
            help="Also set [agent] permission_mode (danger-full-access: the quorum decides).",
        ),
    ] = None,
    operator_key: Annotated[
        list[str] | None,
        typer.Option(
            "--operator-key",
            help="A key of the peer's operators (line or .pub file), which counts as the peer.",
        ),
    ] = None,
) -> None:
    """Add the peer NAME (its KEY, its relay URL) to node.toml, keeping its comments; checked first."""
    path = _config_path(config)
    current = load_config(path)  # a file that does not load now is not edited: its own sentence says why
    if AGENT_ID_PATTERN.fullmatch(name) is None:
        bad_usage(
            f"{name!r} is not a valid agent id: use 1 to 64 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit."
        )
    if key is None or url is None:
        # `peers add beta --replace --operator-key KEY`: the peer keeps its node key and relay URL.
        if not replace or name not in current.peers:
            bad_usage(
                f"give {name}'s node key and relay URL (teaagent peers add {name} KEY URL); only "
                "--replace on an existing peer keeps them."
            )
        key = current.peers[name].public_key if key is None else key
        url = current.peers[name].relay_url if url is None else url
    line = _key_line(key)
    text = path.read_text(encoding="utf-8")
    try:
        edited = edit_peers(
            text,
            name,
            line,
            url.strip(),
            replace=replace,
            quorum=quorum,
            operator_keys=[_key_line(each) for each in operator_key or ()],
            permission_mode=permission_mode,
        )
    except ValueError as exc:
        bad_usage(f"{path}: {exc}.")
    node = _check(path, edited)
    atomic_write(path, edited.encode("utf-8"), mode=stat.S_IMODE(path.stat().st_mode))
    state = (
        f"quorum on, {needed_from(node.quorum.required_approvals, len(node.peers))}"
        if node.quorum.enabled
        else f"{len(node.peers)} peer{'s' if len(node.peers) != 1 else ''}, quorum off"
    )
    typer.echo(
        f"{path}: peers.{name} {'updated' if replace and name in _names(text) else 'added'} "
        f"({fingerprint(parse_public_key(line))}, relay {node.peers[name].relay_url}); {state}."
    )
    if node.quorum.enabled and node.agent.permission_mode in (
        PermissionMode.READ_ONLY,
        PermissionMode.WORKSPACE_WRITE,
    ):
        typer.echo(
            f"note: permission_mode {node.agent.permission_mode.value} refuses shell.run and fs.delete "
            "before the quorum sees them; --permission-mode danger-full-access leaves them to the peers "
            "(allow asks locally too)."
        )
    typer.echo(reload_services(node))


RELOAD_TIMEOUT_SECONDS: Final = 5.0  # a reload reads a few small files; a service that takes longer is stuck


def _reload_one(url: str, token: str, verify: ssl.SSLContext | bool) -> tuple[str, str]:
    """Ask one service to reload: ``("ok" | "down" | "failed", why)``."""
    try:
        response = httpx.post(
            f"{url.rstrip('/')}/v1/reload",
            headers={"Authorization": f"Bearer {token}"},
            timeout=RELOAD_TIMEOUT_SECONDS,
            verify=verify,
        )
    except (httpx.ConnectError, httpx.ConnectTimeout):
        return "down", ""
    except httpx.HTTPError as exc:
        return "failed", f"{url} did not answer: {str(exc) or type(exc).__name__}"
    if response.status_code == 200:
        return "ok", ""
    try:
        message = str(response.json()["message"]).rstrip(".")
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {response.status_code}"
    return "failed", f"{url} answered: {message}"


def reload_services(node: NodeConfig) -> str:
    """Have the node's running relay and approver read its trust files again; the sentence says which did.

    Each is asked with ``POST /v1/reload`` (the node's token); one that is not running reads the
    files when it starts, one that refuses (an older version, a file it cannot load) needs a restart.
    """
    both = f"{node.agent_id}'s relay and approver"
    if node.token is None and not node.token_path.exists():
        # Neither has ever started (the first to start makes the token): nothing to ask, nothing made.
        return f"{both} are not running; they read it when they start."
    try:
        token = node.load_token()
        verify = node.tls.client_verify()
    except ConfigError as exc:
        return f"restart {node.agent_id}'s relay and approver to use it ({str(exc).rstrip('.')})."
    states = {
        "relay": _reload_one(node.relay_url, token, verify),
        "approver": _reload_one(f"http://127.0.0.1:{node.approver.port}", token, True),
    }
    kinds = {state for state, _why in states.values()}
    whys = "; ".join(why for _state, why in states.values() if why)
    if kinds == {"ok"}:
        return f"{both} reloaded it."
    if kinds == {"down"}:
        return f"{both} are not running; they read it when they start."
    if kinds == {"failed"}:
        return f"restart {both} to use it ({whys})."
    clauses: list[str] = []
    for name, (state, why) in states.items():
        who = f"{node.agent_id}'s {name}" if not clauses else f"its {name}"
        if state == "ok":
            clauses.append(f"{who} reloaded it")
        elif state == "down":
            clauses.append(f"{who} is not running (it reads it when it starts)")
        else:
            clauses.append(f"restart {who} to use it ({why})")
    return "; ".join(clauses) + "."


def _names(text: str) -> set[str]:
    peers = tomlkit.parse(text).get("peers")
    return set(peers) if isinstance(peers, Table) else set()


@operators_app.command("add")
def add_operator(
    key: Annotated[str, typer.Argument(help="The operator's public key: a line, or a .pub file.")],
    config: ConfigOption = None,
) -> None:
    """Let the operator's KEY sign for this node: a line of [approver] operators (made if missing)."""
    path = _config_path(config)
    node = load_config(path)
    line = _key_line(key)
    identity = parse_public_key(line).identity
    if identity == node.own_public_key().identity or any(
        known.key.identity == identity for known in node.approver.operator_keys
    ):
        bad_usage(f"{path}: that key already signs for {node.agent_id}.")
    operators = node.approver.operators or path.parent / OPERATORS_FILE
    try:
        before = operators.read_text(encoding="utf-8") if operators.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:  # a folder, unreadable, not text
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "it is not UTF-8 text"
        bad_usage(f"the operators' file {operators} cannot be read: {str(why).rstrip('.').lower()}.")
    if before and not before.endswith("\n"):
        before += "\n"
    after = before + f'{node.agent_id} namespaces="{OPERATOR_NAMESPACES}" {line}\n'
    text = path.read_text(encoding="utf-8")
    document = tomlkit.parse(text)
    approver: Any = document.get("approver")
    if approver is None:
        approver = tomlkit.table()
        document.append("approver", approver)
    # Checked with a temporary operators file beside the real one, named by a temporary node.toml.
    fd, temp_name = tempfile.mkstemp(prefix=f".{operators.name}.", suffix=".check", dir=operators.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(after)
        approver["operators"] = os.path.relpath(temp_name, path.parent)
        try:
            _check(path, tomlkit.dumps(document))
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(temp_name, str(operators))) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
    atomic_write(operators, after.encode("utf-8"), mode=0o644)
    if node.approver.operators is None:
        approver["operators"] = os.path.relpath(operators, path.parent)
        atomic_write(path, tomlkit.dumps(document).encode("utf-8"), mode=stat.S_IMODE(path.stat().st_mode))
    typer.echo(
        f"{operators}: {fingerprint(parse_public_key(line))} signs for {node.agent_id}; "
        f"list it at its peers too: teaagent peers add {node.agent_id} NODE_KEY RELAY_URL --replace "
        "--operator-key KEY."
    )
    typer.echo(reload_services(node))
