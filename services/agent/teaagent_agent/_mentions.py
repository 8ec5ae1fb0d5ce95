"""``@`` mentions: the workspace's files a prompt can carry, listed by prefix and attached to a prompt.

Both stay inside the workspace (no ``..``, no symbolic link leading out) and never look into its
``.teaagent`` folder, where the node keeps its state. Listing walks at most
:data:`MAX_VISITED` entries, breadth first, so a huge tree answers as quickly as a small one.
"""

from __future__ import annotations

import os
import re
from collections import deque
from pathlib import Path
from typing import Final

from teaagent_agent._schemas import MentionOut

__all__ = ["MAX_ATTACHED_BYTES", "MAX_VISITED", "attach_mentions", "list_mentions"]

MAX_VISITED: Final = 20_000  # directory entries looked at per listing
MAX_ATTACHED_FILES: Final = 10
MAX_ATTACHED_BYTES: Final = 256 * 1024  # all attached files of one prompt together
MAX_FILE_BYTES: Final = 100 * 1024  # one attached file: source code, not a data set
SKIPPED: Final = frozenset({".teaagent", ".git", "node_modules", "__pycache__", ".venv"})
_MENTION: Final = re.compile(r"(?<![\w@])@([A-Za-z0-9_./-]+)")


def _inside(root: Path, relative: str) -> Path | None:
    """The real path of ``relative`` when it stays in the workspace and out of its state folder."""
    if not relative or relative.startswith("/") or "\0" in relative:
        return None
    try:
        real = (root / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if real != root and root not in real.parents:
        return None
    parts = real.relative_to(root).parts
    if parts and parts[0] == ".teaagent":
        return None
    return real


def list_mentions(workspace: Path, prefix: str, limit: int) -> list[MentionOut]:
    """Files and folders whose workspace path starts with ``prefix`` (``@`` optional), at most ``limit``."""
    root = workspace.resolve()
    prefix = prefix.removeprefix("@")
    found: list[MentionOut] = []
    queue: deque[tuple[Path, str]] = deque([(root, "")])
    visited = 0
    show_hidden = prefix.rsplit("/", 1)[-1].startswith(".")
    while queue and len(found) < limit and visited < MAX_VISITED:
        folder, relative = queue.popleft()
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            visited += 1
            if visited > MAX_VISITED or len(found) >= limit:
                break
            name = entry.name
            if name in SKIPPED or (name.startswith(".") and not show_hidden):
                continue
            path = f"{relative}{name}"
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                is_file = entry.is_file(follow_symlinks=False)
            except OSError:
                continue
            shown = path + "/" if is_dir else path
            if shown.startswith(prefix):
                if is_dir:
                    found.append(
                        MentionOut(token="@" + shown, kind="folder", name=name, description="folder")
                    )
                elif is_file:
                    try:
                        size = entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
                    found.append(
                        MentionOut(
                            token="@" + path, kind="file", name=name, description=f"file, {size} bytes"
                        )
                    )
            # Walk down only where the prefix can still lead.
            if is_dir and (prefix.startswith(shown) or shown.startswith(prefix)):
                queue.append((Path(entry.path), shown))
    return found


def attach_mentions(workspace: Path, text: str) -> str:
    """``text`` with the workspace files its ``@path`` mentions name appended."""
    root = workspace.resolve()
    attached: list[str] = []
    total = 0
    seen: set[Path] = set()
    for match in _MENTION.finditer(text):
        if len(attached) >= MAX_ATTACHED_FILES:
            break
        relative = match.group(1).rstrip(".")
        path = _inside(root, relative)
        if path is None or path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
        except OSError:
            continue
        if b"\0" in data or total + min(len(data), MAX_FILE_BYTES) > MAX_ATTACHED_BYTES:
            continue
        body = data[:MAX_FILE_BYTES].decode("utf-8", "replace")
        cut = "\n[... cut at 100 KiB]" if len(data) > MAX_FILE_BYTES else ""
        total += min(len(data), MAX_FILE_BYTES)
        attached.append(f'<file path="{relative}">\n{body}{cut}\n</file>')
    if not attached:
        return text
    return text + "\n\n" + "\n\n".join(attached)
