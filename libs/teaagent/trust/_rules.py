"""Per-tool policies and groups of peers (PROTOCOL.md, "Version 2: per-tool policies and groups of peers").

A :class:`QuorumRule` is one ``[[quorum.rules]]`` entry: a tool-name pattern and what it needs,
``required = N`` of all peers or ``all_of`` / ``any_of`` a list of ``{group, required}`` terms. For
a tool call the first matching rule gives a :class:`QuorumPolicy`, the groups expanded to sorted
peer ids: what a version 2 request carries in its ``policy`` field (:meth:`QuorumPolicy.document`).

:meth:`QuorumPolicy.state` is the counting of version 2 over the distinct approvers and deniers
(rules 1 to 6 applied before): each signer counts toward every term whose peers include it;
``all_of`` is approved when every term has its ``required`` approvals, ``any_of`` when one has;
denied as soon as the policy can no longer be met by the signers who have not denied. The relay's
``record_decision.lua`` counts the same from :meth:`QuorumPolicy.script_form` (keep them together;
``tests/test_quorum_policy_parity.py`` holds them to each other).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Final, Literal

__all__ = [
    "POLICY_MODES",
    "PolicyMode",
    "PolicyTerm",
    "QuorumPolicy",
    "QuorumRule",
    "RuleTerm",
    "TermProgress",
    "policy_problem",
]

PolicyMode = Literal["all_of", "any_of"]
PolicyState = Literal["pending", "approved", "denied"]
POLICY_MODES: Final[tuple[PolicyMode, ...]] = ("all_of", "any_of")
POLICY_FIELDS: Final = frozenset({"rule", "all_of", "any_of"})
TERM_FIELDS: Final = frozenset({"peers", "required"})
MAX_TERMS: Final = 64  # far beyond any real policy; bounds the work one request causes


@dataclass(frozen=True)
class RuleTerm:
    """One term of a ``[[quorum.rules]]`` entry as configured: ``{ group = "ops", required = 2 }``."""

    group: str
    required: int


@dataclass(frozen=True, kw_only=True)
class QuorumRule:
    """One ``[[quorum.rules]]`` entry (first match wins).

    Attributes:
        pattern: fnmatch pattern on the tool name, as high-risk patterns are.
        required: N of all peers, when the rule says ``required = N``; None otherwise.
        mode: ``all_of`` or ``any_of`` when the rule has terms; None for ``required = N``.
        terms: The terms of ``all_of`` / ``any_of``.
        timeout_seconds: The request's lifetime under this rule; the ``[quorum]`` one when None.
    """

    pattern: str
    required: int | None = None
    mode: PolicyMode | None = None
    terms: tuple[RuleTerm, ...] = ()
    timeout_seconds: int | None = None

    def matches(self, tool_name: str) -> bool:
        """Whether the rule applies to ``tool_name`` (``fnmatch.fnmatchcase``)."""
        return fnmatchcase(tool_name, self.pattern)

    def problem(self, groups: Mapping[str, Sequence[str]], peers: Sequence[str]) -> str | None:
        """Why this rule can never be met with these groups and peers (one clause), or None."""
        if not self.pattern.strip():
            return "its pattern is empty"
        if (self.required is None) == (self.mode is None):
            return "it needs exactly one of required, all_of or any_of"
        if self.required is not None:
            if not 1 <= self.required <= len(peers):
                return f"required = {self.required} is not between 1 and the {len(peers)} configured peers"
            return None
        if not self.terms:
            return f"its {self.mode} list is empty"
        seen: set[str] = set()
        for term in self.terms:
            if term.group not in groups:
                return f"it names the group {term.group!r}, which [quorum.groups] does not define"
            if term.group in seen:
                return f"it names the group {term.group!r} twice"
            seen.add(term.group)
            size = len(groups[term.group])
            if not 1 <= term.required <= size:
                return (
                    f"its term of group {term.group} requires {term.required} but the group has "
                    f"{size} member{'' if size == 1 else 's'}"
                )
        return None

    def policy(self, groups: Mapping[str, Sequence[str]], peers: Sequence[str]) -> QuorumPolicy:
        """The policy this rule gives a request: groups expanded to sorted peer ids."""
        if self.required is not None:
            return QuorumPolicy(
                rule=self.pattern,
                mode="all_of",
                terms=(PolicyTerm(peers=tuple(sorted(peers)), required=self.required),),
            )
        assert self.mode is not None
        return QuorumPolicy(
            rule=self.pattern,
            mode=self.mode,
            terms=tuple(
                PolicyTerm(peers=tuple(sorted(groups[term.group])), required=term.required, group=term.group)
                for term in self.terms
            ),
        )


@dataclass(frozen=True)
class PolicyTerm:
    """One term of a request's policy: ``required`` distinct approvals among ``peers``.

    ``group`` is the configured group's name when known, for display only: it is not signed.
    """

    peers: tuple[str, ...]
    required: int
    group: str | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        """How the term reads: its group's name, or its peers."""
        return self.group if self.group else ", ".join(self.peers)


@dataclass(frozen=True)
class TermProgress:
    """One term's count: who approved toward it, who denied in it, who may still approve."""

    term: PolicyTerm
    approvers: tuple[str, ...]
    deniers: tuple[str, ...]
    undecided: tuple[str, ...]

    @property
    def met(self) -> bool:
        return len(self.approvers) >= self.term.required

    @property
    def missing(self) -> int:
        return max(0, self.term.required - len(self.approvers))

    @property
    def lost(self) -> bool:
        """The term can no longer be met: too few of its peers have not denied."""
        return len(self.approvers) + len(self.undecided) < self.term.required

    def describe(self) -> str:
        """``ops: met by beta, gamma`` or ``needs 1 more of security: epsilon or zeta``."""
        if self.met:
            return f"{self.term.label}: met by {', '.join(self.approvers)}"
        if self.lost:
            return f"{self.term.label}: can no longer be met (denied by {', '.join(self.deniers)})"
        return f"needs {self.missing} more of {self.term.label}: {' or '.join(self.undecided)}"


@dataclass(frozen=True)
class QuorumPolicy:
    """A request's ``policy`` field (version 2): a rule's name and its terms, all of them or any one."""

    rule: str
    mode: PolicyMode
    terms: tuple[PolicyTerm, ...]

    @property
    def peers(self) -> tuple[str, ...]:
        """The sorted union of the terms' peers: the request's ``peers``."""
        return tuple(sorted({peer for term in self.terms for peer in term.peers}))

    @property
    def required(self) -> int:
        """The largest ``required`` of the terms: the request's ``required_approvals``, for readers."""
        return max(term.required for term in self.terms)

    def document(self) -> dict[str, Any]:
        """The request's ``policy`` field, as signed."""
        return {
            "rule": self.rule,
            self.mode: [{"peers": list(term.peers), "required": term.required} for term in self.terms],
        }

    @classmethod
    def from_document(cls, value: object) -> QuorumPolicy:
        """Read a request's ``policy`` field.

        Raises:
            ValueError: The field is malformed (one clause, see :func:`policy_problem`).
        """
        problem = policy_problem(value)
        if problem is not None:
            raise ValueError(problem)
        assert isinstance(value, Mapping)
        mode: PolicyMode = "all_of" if "all_of" in value else "any_of"
        return cls(
            rule=value["rule"],
            mode=mode,
            terms=tuple(
                PolicyTerm(peers=tuple(term["peers"]), required=term["required"]) for term in value[mode]
            ),
        )

    def named(self, groups: Mapping[str, Sequence[str]]) -> QuorumPolicy:
        """The same policy, its terms labelled with the configured group whose members they are."""
        by_members = {tuple(sorted(members)): name for name, members in groups.items()}
        return QuorumPolicy(
            rule=self.rule,
            mode=self.mode,
            terms=tuple(
                PolicyTerm(peers=term.peers, required=term.required, group=by_members.get(term.peers))
                for term in self.terms
            ),
        )

    def only(self, authorised: Collection[str]) -> QuorumPolicy:
        """The policy with each term's peers limited to ``authorised`` (rule 1)."""
        return QuorumPolicy(
            rule=self.rule,
            mode=self.mode,
            terms=tuple(
                PolicyTerm(
                    peers=tuple(peer for peer in term.peers if peer in authorised),
                    required=term.required,
                    group=term.group,
                )
                for term in self.terms
            ),
        )

    def progress(self, approvers: Collection[str], deniers: Collection[str]) -> tuple[TermProgress, ...]:
        """Each term's count; a signer in ``deniers`` counts as a denial only (rule 6)."""
        return tuple(
            TermProgress(
                term=term,
                approvers=tuple(p for p in term.peers if p in approvers and p not in deniers),
                deniers=tuple(p for p in term.peers if p in deniers),
                undecided=tuple(p for p in term.peers if p not in approvers and p not in deniers),
            )
            for term in self.terms
        )

    def state(
        self, approvers: Collection[str], deniers: Collection[str]
    ) -> Literal["pending", "approved", "denied"]:
        """What distinct approvers and deniers prove, expiry aside (never both approved and denied)."""
        terms = self.progress(approvers, deniers)
        combine = all if self.mode == "all_of" else any
        if combine(term.met for term in terms):
            return "approved"
        lost = any if self.mode == "all_of" else all
        if lost(term.lost for term in terms):
            return "denied"
        return "pending"

    def describe(self, approvers: Collection[str] = (), deniers: Collection[str] = ()) -> str:
        """The rule and each term's count: ``rule git.push*, all of: ops: met by beta, gamma; needs ...``."""
        joined = "; ".join(term.describe() for term in self.progress(approvers, deniers))
        return f"rule {self.rule}, {'all' if self.mode == 'all_of' else 'any'} of: {joined}"

    def summary(self) -> str:
        """The terms alone: ``all of: 2 of beta, gamma; 1 of delta``."""
        terms = "; ".join(f"{term.required} of {', '.join(term.peers)}" for term in self.terms)
        return f"{'all' if self.mode == 'all_of' else 'any'} of: {terms}"

    def terms_of(self, signer: str) -> tuple[str, ...]:
        """The labels of the terms ``signer`` counts toward."""
        return tuple(term.label for term in self.terms if signer in term.peers)

    def script_form(self) -> str:
        """The policy as ``record_decision.lua`` reads it: ``all_of|2:beta,gamma|1:epsilon,zeta``."""
        return "|".join([self.mode, *(f"{term.required}:{','.join(term.peers)}" for term in self.terms)])


def policy_problem(value: object) -> str | None:
    """Why ``value`` is not a well-formed ``policy`` field, or None (agent ids are checked by the caller)."""
    if not isinstance(value, Mapping):
        return "the request's policy is not a JSON object"
    fields = set(value)
    modes = fields & set(POLICY_MODES)
    if "rule" not in fields or len(modes) != 1 or not fields <= POLICY_FIELDS:
        return "the request's policy must hold rule and exactly one of all_of or any_of"
    if not isinstance(value["rule"], str) or not value["rule"]:
        return "the request's policy rule is not a non-empty string"
    terms = value[next(iter(modes))]
    if not (isinstance(terms, list) and 1 <= len(terms) <= MAX_TERMS):
        return f"the request's policy terms are not a list of 1 to {MAX_TERMS} terms"
    for term in terms:
        if not (isinstance(term, Mapping) and set(term) == TERM_FIELDS):
            return "a term of the request's policy is not an object of exactly peers and required"
        peers, required = term["peers"], term["required"]
        if not (isinstance(peers, list) and peers and all(isinstance(peer, str) for peer in peers)):
            return "a term of the request's policy has no list of peers"
        if peers != sorted(set(peers)):
            return "a term of the request's policy has peers that are not sorted and unique"
        if isinstance(required, bool) or not isinstance(required, int) or not 1 <= required <= len(peers):
            return f"a term of the request's policy requires a number that is not between 1 and {len(peers)}"
    return None
