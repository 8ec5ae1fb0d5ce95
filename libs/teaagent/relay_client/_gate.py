"""``RelayQuorumGate``: the policy's quorum gate, by way of the node's own relay."""

from __future__ import annotations

import dataclasses
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from teaagent._display import visible
from teaagent.errors import ApprovalDeniedError, QuorumError, RelayError, SignatureError
from teaagent.quorum import (
    describe_needs,
    evaluate,
    policy_mismatch,
    request_problem,
    sign_request,
    sign_withdrawal,
    verify_withdrawal,
)
from teaagent.relay_client._client import DEFAULT_TIMEOUT, MAX_WAIT_SECONDS, RelayClient
from teaagent.relay_client._models import RequestStatus
from teaagent.relay_client._progress import WaitProgress, WaitWhy, next_reminder
from teaagent.signing import Signer
from teaagent.trust import MultiSigQuorumConfig

if TYPE_CHECKING:
    import httpx

__all__ = ["EXPIRY_GRACE_SECONDS", "STOP_CHECK_SECONDS", "WITHDRAW_TIMEOUT_SECONDS", "RelayQuorumGate"]

logger = logging.getLogger("teaagent.relay_client")

EXPIRY_GRACE_SECONDS: Final = 5  # past expires_at the relay settles "expired" at once; wait that long more
LATE_ANSWER_SECONDS: Final = 2.0  # how long past a long-poll's wait its answer may take to arrive
RETRY_START_SECONDS: Final = 0.25  # the first wait after the relay failed; it doubles per failure
RETRY_CAP_SECONDS: Final = 5.0
# How often a wait with a stop event looks at it. Locally: the long-poll itself goes on beside,
# one per change of the counts (or per minute), never a request every half second.
STOP_CHECK_SECONDS: Final = 0.05
REMIND_CHECK_SECONDS: Final = 0.5  # how often a watched wait looks at its clock for a reminder mark
_TRANSIENT_STATUSES: Final = frozenset({502, 503, 504})  # a proxy or the relay's Redis, briefly away
# An interrupted wait withdraws its request at once or not at all: a user who pressed Ctrl-C is not
# kept waiting on a relay that does not answer (the request then simply expires at the peers).
WITHDRAW_TIMEOUT_SECONDS: Final = 3.0


def _transient(exc: RelayError) -> bool:
    """The relay may answer again: no answer at all (restarting, timed out), or a 502/503/504."""
    return exc.status_code is None or exc.status_code in _TRANSIENT_STATUSES


def _nobody_listens(exc: RelayError) -> bool:
    """Nothing accepted the connection: no relay runs there (a configuration matter, not a blip)."""
    import httpx  # a relay client's failure: its httpx is loaded

    return isinstance(exc.__cause__, httpx.ConnectError)


def _with_denials(certificate: dict[str, Any], denials: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The certificate, carrying as well every signed denial the relay sent beside it in the outcome.

    The policy verifies the certificate with its denials and applies rule 6 (a signer that denied
    counts as a denial only), so a relay that counted beta's denial yet hands over beta's approval
    is caught wherever in its answer it put the denial. A denial it never sends cannot be applied
    (docs/protocol.md, "What a hostile origin relay can still do"). Each denial is carried once.
    """
    if not denials:
        return certificate
    carried = certificate.get("denials", [])
    if not isinstance(carried, list):
        return certificate  # malformed: the policy's verification refuses it as it is
    seen = {json.dumps(denial, sort_keys=True) for denial in carried}
    merged = list(carried)
    for denial in denials:
        key = json.dumps(denial, sort_keys=True)
        if key not in seen:
            seen.add(key)
            merged.append(denial)
    return {**certificate, "denials": merged}


@dataclasses.dataclass
class _Shown:
    """What ``on_wait`` was last shown of one wait, and when to remind it of the time left."""

    request: dict[str, Any]
    asked_at: float
    last: WaitProgress | None = None
    reminder: float | None = None  # the time left (seconds) of the next reminder

    def view(self) -> tuple[object, ...] | None:
        last = self.last
        if last is None:
            return None
        return (last.signers, last.denied_by, last.received, tuple(last.unreachable), last.given_up)


class RelayQuorumGate:
    """Obtains quorum certificates through the node's relay (``teaagent.policy.QuorumGate``).

    ``obtain`` signs the request the policy built for one high-risk call with the node's key,
    posts it to the node's own relay, long-polls its outcome and returns the certificate. It does
    not verify the certificate: the policy does, against the request it built and with the node's
    own configuration, because the relay is not trusted.

    A relay that stops answering once the request was sent (restarted, killed, its Redis briefly
    away) is waited for, with a backoff, until the gate's timeout; the request is then sent again
    before waiting on: the same signed request is one request, and sending it again makes the
    relay queue its deliveries again, in case it died before queueing them. A relay that nobody
    runs fails the first call at once.

    A wait that ends without a decision because it was interrupted (``KeyboardInterrupt`` in
    the waiting thread, or ``stop`` set: a cancelled run) withdraws the request: the gate signs a
    withdrawal with the node's key and posts it to the relay, which tells every peer, within
    :data:`WITHDRAW_TIMEOUT_SECONDS` and best effort. The ``KeyboardInterrupt`` is then raised
    again as it was; :attr:`last_withdrawal` says in one sentence what became of the request.
    """

    def __init__(
        self,
        *,
        relay_url: str,
        token: str,
        origin: str,
        private_key_signer: Signer,
        config: MultiSigQuorumConfig,
        timeout: float | None = None,
        on_progress: Callable[[str], None] | None = None,
        on_status: Callable[[RequestStatus], None] | None = None,
        on_wait: Callable[[WaitProgress], None] | None = None,
        stop: threading.Event | None = None,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """Prepare the gate; nothing is sent until :meth:`obtain`.

        Args:
            relay_url: This node's relay (``relay_url`` of node.toml).
            token: This node's bearer token (``NodeConfig.load_token()``).
            origin: This node's agent id.
            private_key_signer: What signs requests as this node (``NodeConfig.signer()``).
            config: This node's quorum configuration: peers, threshold, timeout.
            timeout: Seconds to wait for the outcome; the request's own lifetime plus a grace
                when None (the request expires by then, and the relay says so).
            on_progress: Called with one line per step (submitted, still waiting...), for a
                command line's stderr.
            on_status: Called with every status the relay sends for the request: the submission's,
                then one per change of its counted decisions (the relay answers the one long-poll
                the gate holds as soon as a decision is counted), and one a minute while nothing
                changes. It shows only the decisions that verify here; the certificate is still
                verified by the policy. A callback that raises is logged and ignored.
            on_wait: Called with the wait as every surface shows it (``teaagent.relay_client.
                describe_wait``): when the request is sent, when what verifies of it changes, at
                the reminder marks of the time left (``next_reminder``, from the local clock: the
                relay is not asked more), and when it is decided. A callback that raises is
                logged and ignored.
            stop: Set it to stop waiting: ``obtain`` then raises ``ApprovalDeniedError`` within
                :data:`STOP_CHECK_SECONDS` (a cancelled run); the long-poll in flight is left to
                end on its own.
            transport: An httpx transport, for tests.
            verify: How an ``https://`` relay's certificate is checked: True for the public CAs,
                or a context trusting a private CA (``NodeConfig.tls.client_verify()``).

        Raises:
            ValueError: ``relay_url`` is not an http(s) URL, ``timeout`` is not positive, or the
                origin is among the configured peers.
        """
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        if origin in config.peer_agent_ids:
            raise ValueError(f"the origin {origin} is among the configured peers")
        self._client = RelayClient(
            relay_url, token=token, timeout=DEFAULT_TIMEOUT, transport=transport, verify=verify
        )
        self._origin = origin
        self._signer = private_key_signer
        self._config = config
        self._given_timeout = timeout
        self._progress = on_progress or (lambda _line: None)
        # Someone reads the progress.
        self._shown = on_status is not None or on_progress is not None or on_wait is not None
        self._on_status = on_status
        self._on_wait = on_wait
        self._stop = stop
        self._last_withdrawal: str | None = None

    @property
    def last_withdrawal(self) -> str | None:
        """The sentence of the last interrupted wait (``Withdrawn: request ... of shell.run; ...``).

        None until a wait was interrupted; a command line prints it as its last line.
        """
        return self._last_withdrawal

    def __repr__(self) -> str:
        return f"RelayQuorumGate(origin={self._origin!r}, relay={self._client.shown!r})"

    def close(self) -> None:
        """Close the relay client's connections."""
        self._client.close()

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        """Sign one request of this node, send it to the peers through the relay, return the certificate.

        Args:
            request: The request document the policy built for one high-risk call
                (:func:`teaagent.quorum.build_request`), unsigned.

        Returns:
            The certificate ``{"request", "request_signature", "approvals"}`` (unverified: the
            policy checks it against ``request``), with ``"denials"``: the signed denials the relay
            carried in it or sent beside it in the outcome, so that the policy applies rule 6.

        Raises:
            ApprovalDeniedError: The peers denied the call (``... denied by delta: reason``), the
                request expired before the quorum was reached, or ``stop`` was set (the request
                is then withdrawn).
            KeyboardInterrupt: The wait was interrupted; the request was withdrawn first.
            TimeoutError: The outcome was still pending when ``timeout`` ran out.
            RelayError: The relay refused the request or is unreachable.
            ValueError: The request is malformed or is not this node's.
        """
        problem = request_problem(request)
        if problem is not None:
            raise ValueError(f"the request cannot be sent: {problem}")
        if request["origin"] != self._origin:
            raise ValueError(f"the request's origin {request['origin']} is not this node ({self._origin})")
        # PROTOCOL.md "Who decides what the policy is": this node signs only the policy its own
        # rules give the tool (version 2), or none where no rule covers it: nobody lowers the bar.
        mismatch = policy_mismatch(request, self._config)
        if mismatch is not None:
            raise ValueError(f"the request cannot be sent: {mismatch}")
        # As long as this request lives (a rule may set its own timeout_seconds), and a grace.
        timeout = (
            self._given_timeout
            if self._given_timeout is not None
            else request["expires_at"] - request["created_at"] + EXPIRY_GRACE_SECONDS
        )
        tool_name = request["tool_name"]
        request_id = request["request_id"]
        signature = sign_request(request, self._signer)
        shown = _Shown(request=request, asked_at=time.time())
        try:
            status = self._wait(request, signature, shown, timeout)
        except KeyboardInterrupt:
            # Best effort, never instead of the interruption: it is raised again as it was.
            self._withdraw(request)
            raise
        if status.state == "approved":
            if status.certificate is None:
                raise RelayError(f"The relay approved request {request_id} but sent no certificate.")
            self._progress(f"request {request_id}: {self._verified(request, status).describe()}.")
            return _with_denials(status.certificate, status.denials)
        if status.state == "denied":
            raise ApprovalDeniedError(self._denial(request, status))
        if status.state == "withdrawn":
            if self._withdrawn_here(request, status):
                raise ApprovalDeniedError(f"{tool_name} was not run: request {request_id} was withdrawn.")
            raise ApprovalDeniedError(
                f"{tool_name} was not run: the relay reported request {request_id} withdrawn, "
                "but sent no withdrawal this node signed."
            )
        # Counted from what verifies here, not from the relay's word.
        raise ApprovalDeniedError(
            f"The request for {tool_name} {self._verified(request, status).describe()}."
        )

    def _wait(self, request: dict[str, Any], signature: str, shown: _Shown, timeout: float) -> RequestStatus:
        """Send the signed request and wait until the relay reports it decided; return that status.

        Raises:
            ApprovalDeniedError: ``stop`` was set (the request is withdrawn first).
            TimeoutError: The outcome was still pending when ``timeout`` ran out.
            RelayError: The relay refused the request or is unreachable.
        """
        tool_name = request["tool_name"]
        request_id = request["request_id"]
        deadline = time.monotonic() + timeout
        failures, last_error = 0, None
        try:
            status = self._client.submit_request(request, signature, timeout=min(DEFAULT_TIMEOUT, timeout))
        except RelayError as exc:
            if not _transient(exc) or _nobody_listens(exc):
                raise
            # It may have died holding the request: it is sent again below.
            failures, status, last_error = 1, None, exc
            self._progress(f"{exc} Trying again.")
        else:
            self._progress(
                f"{tool_name} needs {describe_needs(request, self._config)}; "
                f"request {request_id} sent to the peers."
            )
            if status is not None:
                self._tell(shown, "sent", self._report(request, status))
        while status is None or not status.decided:
            if self._stop is not None and self._stop.is_set():
                what = self._withdraw(request)
                raise ApprovalDeniedError(
                    f"{tool_name} was not run: the wait for its quorum was stopped. {what}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if failures and last_error is not None:
                    raise last_error  # the relay never came back: say so, not "no quorum"
                raise TimeoutError(f"no quorum was reached for {tool_name} within {timeout:g} seconds")
            try:
                if failures:
                    backoff = RETRY_START_SECONDS * 2 ** min(failures - 1, 10)  # capped: no float overflow
                    time.sleep(min(remaining, RETRY_CAP_SECONDS, backoff))
                    limit = max(deadline - time.monotonic(), 0.001)
                    status = self._client.submit_request(
                        request, signature, timeout=min(DEFAULT_TIMEOUT, limit)
                    )
                    self._progress(f"request {request_id} sent again after the relay came back.")
                    failures = 0
                    if status is not None and shown.last is None:
                        self._tell(shown, "sent", self._report(request, status))
                    continue
                # A relay that holds its answer back only delays: no call runs past the deadline by
                # more than the time an honest relay's answer needs to arrive.
                answer = self._long_poll(request_id, remaining, status, shown)
                if answer is None:
                    continue  # stopped: the loop's first step withdraws
                status = answer
            except RelayError as exc:
                if not _transient(exc):
                    raise
                if not failures:
                    self._progress(f"{exc} Waiting for it.")
                failures, last_error = failures + 1, exc
                continue
            verified = self._report(request, status)
            if status.decided:
                break
            self._tell(shown, "changed", verified)  # on_wait: only what changed
            if self._on_wait is None:  # a line per change of the count, or per minute unchanged
                self._progress(f"request {request_id}: {verified.describe()}.")
        if self._on_wait is not None:
            self._tell(shown, "decided", self._verified(request, status))
        return status

    def _tell(self, shown: _Shown, why: WaitWhy, verified: RequestStatus) -> None:
        """Hand ``on_wait`` the wait as it verifies now; a "changed" that changed nothing is not shown."""
        if self._on_wait is None:
            return
        progress = WaitProgress.of(
            verified, tool_name=shown.request["tool_name"], why=why, asked_at=shown.asked_at
        )
        before = shown.view()
        shown.last = progress
        if why == "changed" and shown.view() == before:
            return
        if why != "decided":
            shown.reminder = next_reminder(progress.expires_at - time.time())
        self._call_on_wait(progress)

    def _remind(self, shown: _Shown) -> None:
        """Show the wait again when its time left passed the next reminder mark (no relay call)."""
        last = shown.last
        if last is None or shown.reminder is None:
            return
        left = last.expires_at - time.time()
        if left > shown.reminder:
            return
        shown.reminder = next_reminder(left)
        self._call_on_wait(dataclasses.replace(last, why="reminder"))

    def _call_on_wait(self, progress: WaitProgress) -> None:
        assert self._on_wait is not None
        try:
            self._on_wait(progress)
        except Exception:  # a broken display must not break the wait it displays
            logger.exception("the quorum gate's on_wait callback failed")

    def _long_poll(
        self, request_id: str, remaining: float, last: RequestStatus | None, shown: _Shown
    ) -> RequestStatus | None:
        """One long-poll for the rest of the wait (at most a minute); None when ``stop`` was set meanwhile.

        When someone reads the progress it carries the counts last seen, so the relay answers as
        soon as a decision is counted: one request per change, not one every half second. With a
        ``stop`` event the long-poll runs in a thread of its own and the gate watches the event,
        so that a stop ends the wait at once; the abandoned long-poll ends when the relay answers.

        Raises:
            RelayError: The relay failed, refused, or did not answer in time.
        """
        counted = (len(last.signers), len(last.denied_by)) if self._shown and last is not None else None

        def poll() -> RequestStatus:
            return self._client.wait_outcome(
                request_id,
                min(remaining, MAX_WAIT_SECONDS),
                limit=remaining + LATE_ANSWER_SECONDS,
                counted=counted,
            )

        if self._stop is None and self._on_wait is None:
            return poll()
        done = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["status"] = poll()
            except BaseException as exc:  # handed to the waiting thread as it is
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=run, name="teaagent-quorum-wait", daemon=True).start()
        while True:
            # Awake for a stop every STOP_CHECK_SECONDS, else only for the next reminder mark.
            slice_ = STOP_CHECK_SECONDS if self._stop is not None else REMIND_CHECK_SECONDS
            if done.wait(slice_):
                break
            if self._stop is not None and self._stop.is_set():
                return None
            self._remind(shown)
        if "error" in box:
            raise box["error"]
        status: RequestStatus = box["status"]
        return status

    def _withdraw(self, request: dict[str, Any]) -> str:
        """Withdraw a request whose wait was interrupted; return (and keep) what became of it, one sentence.

        Never raises: a relay that refuses, fails or does not answer within
        :data:`WITHDRAW_TIMEOUT_SECONDS`, a key that cannot sign, even a second Ctrl-C, each
        leaves the request to expire at the peers, and the sentence says so.
        """
        tool_name, request_id = request["tool_name"], request["request_id"]
        try:
            signed = sign_withdrawal(request, self._signer)
            self._client.withdraw(
                request_id, signed["statement"], signed["signature"], timeout=WITHDRAW_TIMEOUT_SECONDS
            )
        except RelayError as exc:
            if exc.code == "already_decided":
                what = (
                    f"Not withdrawn: request {request_id} of {tool_name} was decided first; "
                    f"{tool_name} does not run."
                )
            else:
                what = (
                    f"Not withdrawn: request {request_id} of {tool_name} stays with the peers until it "
                    f"expires ({str(exc).rstrip('.')})."
                )
        except (Exception, KeyboardInterrupt) as exc:  # best effort: whatever failed is said in the sentence
            detail = str(exc).strip().rstrip(".") or type(exc).__name__
            what = (
                f"Not withdrawn: request {request_id} of {tool_name} stays with the peers until it "
                f"expires ({detail})."
            )
        else:
            what = f"Withdrawn: request {request_id} of {tool_name}; the peers drop it."
        logger.info("%s", what)
        self._last_withdrawal = what
        return what

    def _verified(self, request: dict[str, Any], status: RequestStatus) -> RequestStatus:
        """The status with only the signers and deniers whose signed decisions verify here.

        What the asking side shows of a wait (``on_status``, the progress lines) is counted from
        the signed documents the relay sent, under this node's own configuration, never from the
        relay's word: a relay that says "approved by beta" without beta's signature shows nobody.
        """
        certificate = status.certificate or {}
        approvals = [*status.approvals, *(certificate.get("approvals") or ())]
        denials = [*status.denials, *(certificate.get("denials") or ())]
        now = min(time.time(), request["expires_at"])
        try:
            counted = evaluate(request, approvals, denials, self._config, now=now)
            # The signed documents shown beside the names (their keys) are the ones that verify.
            verified_denials = tuple(
                denial
                for denial in denials
                if evaluate(request, [], [denial], self._config, now=now).denied_by
            )
        except (QuorumError, ValueError, TypeError):
            empty: tuple[dict[str, Any], ...] = ()
            return dataclasses.replace(
                status,
                **self._own_fields(request, status),
                signers=(),
                denied_by=(),
                denial_reasons={},
                approvals=empty,
                denials=empty,
            )
        own = self._own_fields(request, status)
        if counted.state != "pending":  # decided by the signed documents themselves
            own["state"] = counted.state
        return dataclasses.replace(
            status,
            **own,
            signers=tuple(counted.signers),
            denied_by=tuple(counted.denied_by),
            denial_reasons=dict(counted.denial_reasons),
            approvals=tuple(counted.approvals),
            denials=verified_denials,
            policy=counted.policy,
        )

    def _withdrawn_here(self, request: dict[str, Any], status: RequestStatus) -> bool:
        """Whether the relay's ``withdrawn`` comes with this node's own signed withdrawal of ``request``.

        Any other withdrawal is the relay's word alone: the wait still ends (a relay can always
        keep a request from being counted), but nobody is told this node withdrew it.
        """
        carried = status.withdrawal or {}
        statement, signature = carried.get("statement"), carried.get("signature")
        if not isinstance(statement, dict) or not isinstance(signature, str):
            return False
        try:
            verify_withdrawal(request, statement, signature, self._signer.public_key.to_line())
        except (QuorumError, SignatureError, ValueError):
            return False
        return True

    def _own_fields(self, request: dict[str, Any], status: RequestStatus) -> dict[str, Any]:
        """What the status says of the request that this node signed itself: taken from the request.

        The id, the peers, the threshold and the expiry a wait shows are the signed request's (and
        this node's configuration's), whatever the relay reports; of the relay's state only a
        withdrawal is kept (this node withdrew it); ``expired`` is read off this machine's clock,
        and an ``approved`` or ``denied`` the signed documents do not show is ``pending`` here.
        """
        required = max(int(request.get("required_approvals", 0)), self._config.required_approvals)
        return {
            "request_id": request["request_id"],
            "peers": tuple(request["peers"]),
            "required": required,
            "expires_at": request["expires_at"],
            "state": (
                "withdrawn"
                if status.state == "withdrawn" and self._withdrawn_here(request, status)
                else "expired"
                if time.time() > request["expires_at"]
                else "pending"
            ),
        }

    def _report(self, request: dict[str, Any], status: RequestStatus) -> RequestStatus:
        """Hand the verified status to ``on_status``; return it (the relay's, unread, when nobody looks)."""
        if not self._shown:
            return status  # nothing is shown: the signatures are verified once, in the certificate
        shown = self._verified(request, status)
        if self._on_status is None:
            return shown
        try:
            self._on_status(shown)
        except Exception:  # a broken display must not break the wait it displays
            logger.exception("the quorum gate's on_status callback failed")
        return shown

    def _denial(self, request: dict[str, Any], status: RequestStatus) -> str:
        """The sentence of a denial, naming only the deniers whose signed denials verify here.

        The call does not run either way (a relay can always refuse to pass an approval on), but
        the audit log must not blame a peer on the relay's word alone.
        """
        tool_name = request["tool_name"]
        try:
            # As of now, or of the expiry if the answer came just after it: a denial counts then.
            now = min(time.time(), request["expires_at"])
            outcome = evaluate(request, [], list(status.denials), self._config, now=now)
        except QuorumError as exc:
            problem = str(exc).rstrip(".")
        else:
            if outcome.state == "denied":
                return f"{tool_name} was {outcome.describe()}."
            problem = "; ".join(f"{peer}: {why}" for peer, why in outcome.rejected_denials.items())
            if not problem:
                problem = (
                    "the signed denials that verify are too few to deny it"
                    if status.denials
                    else "it sent no signed denials"
                )
        # Neither the relay's deniers nor its reasons: unproven, they would read as a peer's
        # (and a line break in them as a line of their own). What was refused is on one line.
        return (
            f"{tool_name} was not run: the relay reported it denied, "
            f"but the denials it sent do not prove it ({visible(problem)})."
        )
