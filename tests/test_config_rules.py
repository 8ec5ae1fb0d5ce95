"""Version 2 configuration: ``[quorum.groups]`` and ``[[quorum.rules]]`` (PROTOCOL.md, "Version 2").

A rule that can never be met is refused when the file loads, in one sentence naming the rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from config_support import EXAMPLE, load
from config_support import (
    fixture_node_dir as fixture_node_dir,  # the fixture: keys/alpha and the current directory
)

from teaagent.errors import ConfigError
from teaagent.trust import PolicyTerm, QuorumPolicy

AFTER = "allow_dev_signatures = false\n"  # where [quorum]'s own keys end in EXAMPLE

GROUPS = """
[quorum.groups]
ops = ["beta", "gamma"]
security = ["delta"]
"""

RULES = """
[[quorum.rules]]
pattern = "git.push*"
all_of = [{ group = "ops", required = 2 }, { group = "security", required = 1 }]
timeout_seconds = 600

[[quorum.rules]]
pattern = "fs.delete"
required = 1

[[quorum.rules]]
pattern = "shell.*"
any_of = [{ group = "ops", required = 1 }, { group = "security", required = 1 }]
"""


def with_rules(rules: str = RULES, groups: str = GROUPS) -> str:
    return EXAMPLE.replace(AFTER, AFTER + groups + rules)


def test_rules_give_each_tool_its_policy_first_match_wins(node_dir: Path) -> None:
    quorum = load(with_rules()).quorum
    assert quorum.policy_for("git.push.release") == QuorumPolicy(
        rule="git.push*",
        mode="all_of",
        terms=(PolicyTerm(peers=("beta", "gamma"), required=2), PolicyTerm(peers=("delta",), required=1)),
    )
    assert quorum.policy_for("git.push").terms[0].group == "ops"  # type: ignore[union-attr]
    assert quorum.timeout_for("git.push") == 600
    # required = N is N of all peers.
    assert quorum.policy_for("fs.delete") == QuorumPolicy(
        rule="fs.delete", mode="all_of", terms=(PolicyTerm(peers=("beta", "delta", "gamma"), required=1),)
    )
    assert quorum.timeout_for("fs.delete") == 120
    assert quorum.policy_for("shell.run").mode == "any_of"  # type: ignore[union-attr]
    # No rule: version 1, required_approvals of all peers.
    assert quorum.policy_for("http.get") is None


def test_a_file_without_rules_is_version_1(node_dir: Path) -> None:
    quorum = load(EXAMPLE).quorum
    assert quorum.rules == ()
    assert quorum.groups == {}
    assert quorum.policy_for("shell.run") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            with_rules(RULES.replace('{ group = "ops", required = 2 }', '{ group = "ops", required = 3 }')),
            "alpha.toml: quorum rule 1 ('git.push*') cannot be met: its term of group ops requires 3 "
            "but the group has 2 members.",
        ),
        (
            with_rules(RULES.replace('group = "security"', 'group = "audit"', 1)),
            "alpha.toml: quorum rule 1 ('git.push*') cannot be met: it names the group 'audit', which "
            "[quorum.groups] does not define.",
        ),
        (
            with_rules(
                RULES.replace(
                    'all_of = [{ group = "ops", required = 2 }, { group = "security", required = 1 }]',
                    "all_of = []",
                )
            ),
            "alpha.toml: quorum rule 1 ('git.push*') cannot be met: its all_of list is empty.",
        ),
        (
            with_rules(RULES.replace("required = 1\n", "required = 4\n", 1)),
            "alpha.toml: quorum rule 2 ('fs.delete') cannot be met: required = 4 is not between 1 and the "
            "3 configured peers.",
        ),
        (
            with_rules(
                RULES.replace(
                    "required = 1\n", 'required = 1\nany_of = [{ group = "ops", required = 1 }]\n', 1
                )
            ),
            "alpha.toml: quorum rule 2 ('fs.delete') needs exactly one of required, all_of or any_of.",
        ),
        (
            with_rules(groups=GROUPS.replace('["delta"]', '["delta", "epsilon"]')),
            "alpha.toml: quorum group security names epsilon, which is not a configured peer.",
        ),
        (
            with_rules(RULES.replace("timeout_seconds = 600", "timeout_seconds = 0")),
            "alpha.toml: quorum rule 1 ('git.push*') cannot be met: its timeout_seconds is not between 1 "
            "and 86400.",
        ),
        (
            with_rules(groups=GROUPS.replace('["delta"]', "[]")),
            "alpha.toml: quorum.groups.security is empty, so no term could ever count toward it.",
        ),
        (
            with_rules(RULES.replace('{ group = "ops", required = 2 }', '{ group = "ops", needed = 2 }')),
            "alpha.toml: unknown key quorum.rules[0].all_of[0].needed",
        ),
    ],
    ids=[
        "group-too-small",
        "unknown-group",
        "empty-list",
        "required-too-large",
        "two-kinds",
        "unknown-peer",
        "timeout",
        "empty-group",
        "typo",
    ],
)
def test_a_rule_that_cannot_be_met_is_refused_in_one_sentence_naming_it(
    node_dir: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)) as caught:
        load(text)
    sentence = str(caught.value)
    assert sentence.endswith(".")
    assert "\n" not in sentence
