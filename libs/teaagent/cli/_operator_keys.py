"""An operator's own key for ``teaagent approvals``: a key file (its passphrase asked once) or ssh-agent."""

from __future__ import annotations

import getpass
import os
import stat
import sys
from pathlib import Path
from typing import Final

from teaagent._files import expand_home
from teaagent.cli._exit import bad_usage
from teaagent.config import NodeConfig
from teaagent.errors import ConfigError, SignatureError
from teaagent.signing import (
    AgentSigner,
    Signer,
    SSHPublicKey,
    agent_identities,
    load_private_key,
)

_PASSPHRASE_NEEDED: Final = "is protected by a passphrase"  # noqa: S105 - load_private_key's sentence

# -- local signing ------------------------------------------------------------------------------


def _terminal_available() -> bool:
    """Whether a passphrase can be asked without echo: ``getpass`` reads the controlling terminal."""
    try:
        descriptor = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(descriptor)
    return True


def _warn_if_exposed(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # loading names the problem
    if stat.S_ISREG(mode) and mode & 0o077:
        sys.stderr.write(
            f"teaagent: warning: the private key file {path} is accessible by others (mode "
            f"{stat.S_IMODE(mode):04o}; OpenSSH refuses such a key): run chmod 600 {path}.\n"
        )


def key_file_signer(path: Path) -> Signer:
    """Load an operator's private key file, asking its passphrase once without echo when it has one.

    Raises:
        typer.Exit: Exit 2 with the sentence naming the problem: a folder, a missing or unreadable
            file, not a key, a passphrase needed with no terminal to ask it, a wrong passphrase.
    """
    path = expand_home(path)
    if path.is_dir():
        bad_usage(f"the private key {path} is a folder, not a key file.")
    try:
        key = load_private_key(path)
    except ConfigError as exc:
        if _PASSPHRASE_NEEDED not in str(exc):
            bad_usage(str(exc))  # a .pub file among them: only that sentence, no warning about its mode
    else:
        _warn_if_exposed(path)
        return key
    _warn_if_exposed(path)
    if not _terminal_available():
        bad_usage(
            f"the private key {path} is protected by a passphrase, and there is no terminal to ask "
            "for it; run the command in a terminal, or add the key to ssh-agent and use --agent."
        )
    passphrase = getpass.getpass(f"Passphrase for {path}: ")
    try:
        return load_private_key(path, passphrase)
    except ConfigError as exc:
        bad_usage(str(exc))


def _fingerprint_arg(text: str) -> str:
    return text if text.startswith("SHA256:") else f"SHA256:{text}"


def agent_signer(node: NodeConfig, key_id: str | None) -> Signer:
    """Choose the ssh-agent's key to sign with: ``key_id``, its only key, or its only key of this node.

    Raises:
        typer.Exit: Exit 2 when there is no agent, it holds no (such) key, or several keys fit.
    """
    try:
        keys = agent_identities()
    except SignatureError as exc:
        bad_usage(str(exc))
    socket_path = os.environ.get("SSH_AUTH_SOCK", "")  # agent_identities found the agent there
    if not keys:
        bad_usage(f"the ssh-agent at {socket_path} holds no key; add one with ssh-add.")
    held = ", ".join(key.fingerprint for key in keys)
    chosen: SSHPublicKey
    if key_id is not None:
        wanted = _fingerprint_arg(key_id)
        matching = [key for key in keys if key.fingerprint == wanted]
        if not matching:
            bad_usage(f"the ssh-agent at {socket_path} holds no key {wanted}; it holds {held}.")
        chosen = matching[0]
    elif len(keys) == 1:
        chosen = keys[0]
    else:
        try:
            own = {key.key.identity for key in node.own_keys()}
        except ConfigError:
            own = set()
        mine = [key for key in keys if key.identity in own]
        if len(mine) != 1:
            bad_usage(
                f"the ssh-agent at {socket_path} holds {len(keys)} keys"
                + (f", {len(mine)} of them keys of {node.agent_id}" if mine else "")
                + f"; choose one with --key-id: {held}."
            )
        chosen = mine[0]
    return AgentSigner(chosen, socket_path)


def local_signer(node: NodeConfig, key: Path | None, agent: bool, key_id: str | None) -> Signer | None:
    if key is not None and agent:
        bad_usage("--key and --agent are two ways to sign; give one of them.")
    if key_id is not None and not agent:
        bad_usage("--key-id chooses a key held by ssh-agent; give it with --agent.")
    if key is not None:
        return key_file_signer(key)
    if agent:
        return agent_signer(node, key_id)
    return None
