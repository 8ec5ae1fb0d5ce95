"""``teaagent._files.read_limited``: a whole small file, or the caller's one sentence for what went wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from teaagent._files import FileSentences, read_limited
from teaagent.errors import ConfigError

SENTENCES = FileSentences(
    missing="it is missing.",
    unreadable=lambda reason: f"it cannot be read: {reason}.",
    too_large="it is too large.",
)


def test_a_file_within_the_limit_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_limited(path, 10, SENTENCES) == b"x" * 10


def test_one_byte_past_the_limit_is_too_large(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 11)
    with pytest.raises(ConfigError, match=r"^it is too large\.$"):
        read_limited(path, 10, SENTENCES)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^it is missing\.$"):
        read_limited(tmp_path / "nothing", 10, SENTENCES)


def test_a_folder_is_unreadable_unless_a_folder_sentence_is_given(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^it cannot be read: Is a directory\.$"):
        read_limited(tmp_path, 10, SENTENCES)
    folder = FileSentences(
        missing="", unreadable=lambda reason: reason, too_large="", folder="it is a folder, {not} a file."
    )
    with pytest.raises(ConfigError, match=r"^it is a folder, \{not\} a file\.$"):
        read_limited(tmp_path, 10, folder)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_says_why(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    path.chmod(0)
    with pytest.raises(ConfigError, match=r"^it cannot be read: Permission denied\.$"):
        read_limited(path, 10, SENTENCES)


def test_the_sentences_of_a_subject(tmp_path: Path) -> None:
    sentences = FileSentences.of("the {odd} file", 3)
    with pytest.raises(ConfigError, match=r"^the \{odd\} file does not exist\.$"):
        read_limited(tmp_path / "nothing", 3, sentences)
    with pytest.raises(ConfigError, match=r"^the \{odd\} file cannot be read: Is a directory\.$"):
        read_limited(tmp_path, 3, sentences)
    (tmp_path / "big").write_bytes(b"1234")
    with pytest.raises(ConfigError, match=r"^the \{odd\} file is larger than 3 bytes\.$"):
        read_limited(tmp_path / "big", 3, sentences)
