"""What an operator is shown of a version 2 request's policy: its rule, its terms, this node's term.

One wording for every view (``approvals show`` and ``watch``, the TUI's ``/inbox``, the approver's
webhooks and web inbox): :func:`shown_policy` reads the policy from the signed request (a
:class:`~teaagent.quorum.VerifiedRequest`, or the document it answers), never from what a relay
says beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from teaagent._words import plural
from teaagent.quorum._request import request_policy, request_problem
from teaagent.quorum._verified import VerifiedRequest
from teaagent.trust import MultiSigQuorumConfig

__all__ = ["ShownPolicy", "describe_needs", "shown_policy"]


def describe_needs(request: Mapping[str, Any], config: MultiSigQuorumConfig) -> str:
    """What the asking side says a request needs: ``2 approvals from 3 peers``, or (version 2) its
    rule and terms, ``rule 'git.push*' (all of: 2 of beta, gamma; 1 of delta)``, named after this
    node's groups."""
    policy = request_policy(request)
    if policy is None:
        return config.describe_quorum()
    return f"rule {policy.rule!r} ({policy.named(config.groups).summary()})"


@dataclass(frozen=True)
class ShownPolicy:
    """A version 2 request's rule and terms as shown to ``node_id``'s operator.

    Attributes:
        rule: The rule's pattern (``git.push*``).
        every: ``all`` (``all_of``) or ``any`` (``any_of``).
        terms: Each term, ``2 of beta, gamma``, in the request's order (numbered from 1 when shown).
        mine: The numbers of the terms ``node_id``'s decision counts toward.
        node_id: The node whose operator looks.
        origin: The node that counts the decisions.
    """

    rule: str
    every: str
    terms: tuple[str, ...]
    mine: tuple[int, ...]
    node_id: str
    origin: str

    @property
    def heading(self) -> str:
        """``rule git.push*: all of 2 terms, counted by alpha``."""
        return (
            f"rule {self.rule}: {self.every} of {plural(len(self.terms), 'term')}, counted by {self.origin}"
        )

    @property
    def numbered(self) -> tuple[tuple[str, str], ...]:
        """``(("term 1", "2 of beta, gamma"), ...)``."""
        return tuple((f"term {number}", term) for number, term in enumerate(self.terms, 1))

    @property
    def counts(self) -> str:
        """``delta's decision counts toward term 2`` (or toward nothing, when it is in no term)."""
        if not self.mine:
            return f"{self.node_id} is in none of its terms: its decision counts toward nothing"
        return f"{self.node_id}'s decision counts toward {' and '.join(f'term {n}' for n in self.mine)}"

    def line(self) -> str:
        """All of it on one line: heading, terms, this node's term."""
        terms = "; ".join(f"{name}: {term}" for name, term in self.numbered)
        return f"{self.heading}; {terms}; {self.counts}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the rule, ``all``/``any``, the terms, this node's term numbers and the words."""
        return {
            "rule": self.rule,
            "every": self.every,
            "terms": list(self.terms),
            "counts_toward": list(self.mine),
            "text": self.line(),
        }


def shown_policy(request: VerifiedRequest | Mapping[str, Any], node_id: str) -> ShownPolicy | None:
    """The policy of a signed request as ``node_id``'s operator sees it; None for version 1.

    Args:
        request: The verified request, or the document a verified request answered
            (:meth:`VerifiedRequest.document`); a malformed document shows no policy.
        node_id: This node's ``agent_id``.
    """
    document = request.document() if isinstance(request, VerifiedRequest) else request
    if request_problem(document) is not None:
        return None
    policy = request_policy(document)
    if policy is None:
        return None
    return ShownPolicy(
        rule=policy.rule,
        every="all" if policy.mode == "all_of" else "any",
        terms=tuple(f"{term.required} of {', '.join(term.peers)}" for term in policy.terms),
        mine=tuple(number for number, term in enumerate(policy.terms, 1) if node_id in term.peers),
        node_id=node_id,
        origin=str(document["origin"]),
    )
