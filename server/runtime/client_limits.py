"""How much a client may send and get wrong before its session is closed: once, for every wire.

Two rules, both ending the session with 1008 (``invalid_request_error``):

- a **message rate**: more than ``max_messages_per_s`` messages (any kind) in one 1 s window;
- an **error budget**: the ``max_client_errors``-th refused client event (a :class:`Fault` the
  wire answers with its protocol's ``error`` event) closes instead of answering.

A wire only declares its numbers (:class:`~kame.server.runtime.wire.Wire` attributes; the Moshi
protocol has neither, so it declares none) and refuses events; the runtime counts here.
"""

from __future__ import annotations

from dataclasses import replace

from starlette import status

from kame.server.runtime.end import SessionEnd
from kame.server.runtime.wire import Fault

#: The event protocols' limits (``/v1/realtime`` and ``/v1/live/sessions`` declare these): refused client
#: events before the client is closed, and messages (any kind) in one second.
MAX_CLIENT_ERRORS = 50
MAX_MESSAGES_PER_S = 1000


class ClientLimits:
    """One session's message-rate window and error count (``None``: that rule is off)."""

    def __init__(self, protocol: str, max_messages_per_s: int | None, max_client_errors: int | None) -> None:
        self.protocol = protocol
        self.max_messages_per_s = max_messages_per_s
        self.max_client_errors = max_client_errors
        self._window = -1e9
        self._count = 0
        #: client events refused so far (each answered with an error, the last one closing)
        self.client_errors = 0

    def message(self, now: float) -> Fault | None:
        """One client message arrived at ``now`` (monotonic): the closing fault when it is over the rate."""
        if self.max_messages_per_s is None:
            return None
        if now - self._window >= 1.0:
            self._window = now
            self._count = 0
        self._count += 1
        if self._count <= self.max_messages_per_s:
            return None
        error = f"more than {self.max_messages_per_s} messages in one second"
        end = SessionEnd("protocol", status.WS_1008_POLICY_VIOLATION, "too many messages", error, "rate_limited",
                         "invalid_request_error")
        return Fault(kind=f"{self.protocol}_rate", message=error, end=end)

    def refused(self, fault: Fault) -> Fault:
        """A refused client event (``code`` set, answered, not ending): itself, or the fault that closes the
        session when it uses up the error budget."""
        if fault.end is not None or fault.code is None or self.max_client_errors is None:
            return fault
        self.client_errors += 1
        if self.client_errors < self.max_client_errors:
            return fault
        error = f"{self.client_errors} invalid client events; last: {fault.message}"
        end = SessionEnd("protocol", status.WS_1008_POLICY_VIOLATION, "too many invalid events", error, "too_many_errors",
                         "invalid_request_error")
        return replace(fault, message=error, reply=(), end=end)
