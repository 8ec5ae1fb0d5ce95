"""What each workspace tool takes and returns: its limits, and its input and output JSON Schemas."""

from __future__ import annotations

from typing import Any, Final

from teaagent.tools._shell import DEFAULT_SHELL_TIMEOUT, MAX_SHELL_TIMEOUT

MAX_READ_BYTES: Final = 1024 * 1024  # 1 MiB: the default and the most fs.read returns; a file, not a dump
MAX_WRITE_CHARS: Final = 4 * 1024 * 1024  # a source file or a document, not a data set
MAX_PATH_CHARS: Final = 4096  # PATH_MAX on Linux
MAX_LIST_ENTRIES: Final = 1000  # enough to see a project's shape; narrow the path for more
MAX_SEARCH_MATCHES: Final = 200  # a model reads a page of hits, then refines the pattern
MAX_SEARCH_FILES: Final = 5000  # files opened per search, so one call cannot walk a whole disk
MAX_SEARCH_FILE_BYTES: Final = 1024 * 1024  # larger files are data or builds: skipped
MAX_SEARCH_LINE_CHARS: Final = 500  # a matching line is cut here (minified files have huge lines)
MAX_PATTERN_CHARS: Final = 1000  # a regular expression, not a program
MAX_COMMAND_CHARS: Final = 64 * 1024  # a command line, not a script file


def _truncated_list(key: str, most: int, item: dict[str, Any]) -> dict[str, Any]:
    """An output of at most ``most`` objects under ``key`` (every one of ``item``'s fields required), and
    whether more were cut off (``truncated``)."""
    return {
        "type": "object",
        "properties": {
            key: {
                "type": "array",
                "maxItems": most,
                "items": {
                    "type": "object",
                    "properties": item,
                    "required": list(item),
                    "additionalProperties": False,
                },
            },
            "truncated": {"type": "boolean"},
        },
        "required": [key, "truncated"],
        "additionalProperties": False,
    }


_PATH = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_PATH_CHARS,
    "description": "Relative to the workspace root.",
}

FS_READ_INPUT = {
    "type": "object",
    "properties": {
        "path": _PATH,
        "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_READ_BYTES, "default": MAX_READ_BYTES},
    },
    "required": ["path"],
    "additionalProperties": False,
}
FS_READ_OUTPUT = {
    "type": "object",
    "properties": {
        "content": {"type": "string"},
        "size": {"type": "integer", "minimum": 0, "description": "The file's size in bytes."},
        "truncated": {"type": "boolean"},
    },
    "required": ["content", "size", "truncated"],
    "additionalProperties": False,
}
FS_WRITE_INPUT = {
    "type": "object",
    "properties": {
        "path": _PATH,
        "content": {"type": "string", "maxLength": MAX_WRITE_CHARS},
        "create_dirs": {"type": "boolean", "default": False},
    },
    "required": ["path", "content"],
    "additionalProperties": False,
}
FS_WRITE_OUTPUT = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "bytes_written": {"type": "integer", "minimum": 0}},
    "required": ["path", "bytes_written"],
    "additionalProperties": False,
}
FS_LIST_INPUT = {
    "type": "object",
    "properties": {
        "path": {**_PATH, "default": "."},
        "recursive": {"type": "boolean", "default": False},
    },
    "additionalProperties": False,
}
FS_LIST_OUTPUT = _truncated_list(
    "entries",
    MAX_LIST_ENTRIES,
    {
        "path": {"type": "string"},
        "type": {"enum": ["file", "directory", "symlink", "other"]},
        "size": {"type": "integer", "minimum": 0},
    },
)
FS_SEARCH_INPUT = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_PATTERN_CHARS,
            "description": "A Python regular expression searched in each line.",
        },
        "path": {**_PATH, "default": "."},
        "glob": {
            "type": "string",
            "minLength": 1,
            "maxLength": 256,
            "description": "Only files whose path matches, from the right: '*.py', 'tests/test_*.py'.",
        },
    },
    "required": ["pattern"],
    "additionalProperties": False,
}
FS_SEARCH_OUTPUT = _truncated_list(
    "matches",
    MAX_SEARCH_MATCHES,
    {"path": {"type": "string"}, "line": {"type": "integer", "minimum": 1}, "text": {"type": "string"}},
)
FS_DELETE_INPUT = {
    "type": "object",
    "properties": {"path": _PATH},
    "required": ["path"],
    "additionalProperties": False,
}
FS_DELETE_OUTPUT = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "deleted": {"type": "boolean"}},
    "required": ["path", "deleted"],
    "additionalProperties": False,
}
SHELL_RUN_INPUT = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "minLength": 1, "maxLength": MAX_COMMAND_CHARS},
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_SHELL_TIMEOUT,
            "default": DEFAULT_SHELL_TIMEOUT,
            "description": "Seconds before the command and all its children are killed.",
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}
SHELL_RUN_OUTPUT = {
    "type": "object",
    "properties": {
        "exit_code": {
            "type": "integer",
            "description": "Negative: killed by that signal (-9 after a timeout).",
        },
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "timed_out": {"type": "boolean"},
        "truncated": {"type": "boolean"},
    },
    "required": ["exit_code", "stdout", "stderr", "timed_out", "truncated"],
    "additionalProperties": False,
}
