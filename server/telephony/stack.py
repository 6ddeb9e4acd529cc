"""SIP in ``kame serve``: the supervised PJSIP children, and each call from INVITE to session, as OpenAI has it.

:class:`SipService` starts the children (:mod:`~kame.server.telephony.child`; 4 calls each, on ``port``,
``port + 1``, ...), restarts one that exits (one log line; its calls end), and turns its events into OpenAI's flow: an INVITE from an
allowed network, with a free slot, rings (180) and becomes a :class:`Pending` call announced by signed webhooks
(:mod:`~kame.server.telephony.webhook`, retried until ``accept_timeout_s``, then SIP 480); the first
accept (``/v1/realtime/calls/{id}/accept`` or ``/v1/live/sessions/{id}/accept``) answers it (200 OK) and
runs its session on a :class:`~kame.server.telephony.transport.SipTransport`, registered with the WebRTC
calls so that the sideband and ``/hangup`` find it. Without a webhook URL it is accepted at once with
``sip.default_session``. Decisions (network, status codes, targets) are :mod:`~.decisions`' pure functions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kame.server.telemetry.logs import session_logger
from kame.server.telephony import decisions, ipc, webhook
from kame.server.telephony.metrics import SipMetrics
from kame.server.telephony.transport import SipTransport

if TYPE_CHECKING:
    from kame.server.runtime.session import SessionRuntime
    from kame.server.runtime.wire import Wire
    from kame.server.state import AppState
    from kame.server.webrtc.signaling import Call
    from kame.session.settings import SessionSettings

log = logging.getLogger("kame.server.sip")

RESTART_DELAY_S = 1.0
#: Calls one PJSIP process holds: the pjsua2 wheels are built with PJSUA_MAX_CALLS 4 (a compile-time array).
CALLS_PER_PROCESS = 4
#: A call's number carries its child in the bits above these (children number their calls from k << 24).
CID_BITS = 24
#: Calls ringing at once, per engine slot (more INVITEs are refused Busy: a flood cannot pile up webhooks).
PENDING_PER_SLOT = 4


@dataclass
class Pending:
    """A ringing call waiting for its accept: its ids on both APIs, the INVITE's headers, its deadline."""

    cid: int
    call_id: str
    live_id: str
    headers: list[dict[str, str]]
    src: str
    deadline: float
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


class AcceptError(Exception):
    """An accept/reject/refer refused: the HTTP status, the one-sentence message and OpenAI's error code."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


class SipService:
    """The SIP child and the calls it carries (one per app, on ``app.state.kame_sip``)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.cfg = state.cfg.sip
        self.metrics = SipMetrics(state.metrics.registry)
        self.pending: dict[str, Pending] = {}  # by call_id and by live_id
        self.ringing: dict[int, Pending] = {}
        self.active: dict[int, SipTransport] = {}
        self.processes = self.cfg.processes or max(1, -(-state.host.max_sessions // CALLS_PER_PROCESS))
        self._writers: list[asyncio.StreamWriter | None] = [None] * self.processes
        self._procs: list[asyncio.subprocess.Process | None] = [None] * self.processes
        self.ready = [asyncio.Event() for _ in range(self.processes)]
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._http: Any = None

    # ------------------------------------------------------------------ the children
    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._supervise(k), name=f"kame-sip-stack-{k}") for k in range(self.processes)]

    async def aclose(self) -> None:
        self._stopping = True
        for pending in list(self.ringing.values()):
            self._finish_pending(pending, 503, "shutting_down")
        for writer in self._writers:
            if writer is not None:
                writer.close()
        for proc in self._procs:
            if proc is not None and proc.returncode is None:
                try:
                    await asyncio.wait_for(proc.wait(), 3.0)
                except asyncio.TimeoutError:
                    proc.kill()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    def child_config(self, k: int) -> dict[str, Any]:
        """Child ``k``'s settings: port ``port + k``, its share of the RTP range, call numbers from ``k << 24``."""
        c = self.cfg
        assert c.port is not None
        share = (c.rtp_port_max - c.rtp_port_min + 1) // self.processes
        first = c.rtp_port_min + k * share
        return {"port": c.port + k, "host": c.host, "public_address": c.public_address, "transports": c.transports,
                "rtp_port_min": first, "rtp_port_max": first + share - 1, "codecs": c.codecs,
                "max_calls": CALLS_PER_PROCESS, "first_cid": k << CID_BITS}

    async def _supervise(self, k: int) -> None:
        while not self._stopping:
            started = time.monotonic()
            rc = await self._run_child(k)
            if self._stopping:
                return
            lost = self._end_all(k, f"the SIP stack exited ({rc})")
            self.metrics.restarts.inc()
            log.error("SIP stack %d (PJSIP child, port %d) exited with code %s after %.0f s; %d call(s) ended; "
                      "restarting in %.0f s", k, self.child_config(k)["port"], rc, time.monotonic() - started, lost,
                      RESTART_DELAY_S)
            await asyncio.sleep(RESTART_DELAY_S)

    async def _run_child(self, k: int) -> int | None:
        ours, theirs = socket.socketpair()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kame.server.telephony.child", str(theirs.fileno()), json.dumps(self.child_config(k)),
                pass_fds=(theirs.fileno(),), stdout=asyncio.subprocess.DEVNULL)  # PJSIP's start-up chatter
        finally:
            theirs.close()
        self._procs[k] = proc
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        self._writers[k] = writer
        try:
            while True:
                head = await reader.readexactly(ipc.HEADER.size)
                kind, cid, size = ipc.HEADER.unpack(head)
                payload = await reader.readexactly(size)
                if kind == ipc.AUDIO:
                    transport = self.active.get(cid)
                    if transport is not None:
                        transport.audio_in(payload)
                else:
                    self._on_event(k, cid, json.loads(payload))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self._writers[k] = None
            self.ready[k].clear()
        return await proc.wait()

    def send_child(self, frame: bytes) -> None:
        """Write one IPC frame to the child that owns its call number."""
        k = ipc.HEADER.unpack_from(frame)[1] >> CID_BITS
        writer = self._writers[k] if k < len(self._writers) else None
        if writer is not None and not writer.is_closing():
            writer.write(frame)

    def _end_all(self, k: int, reason: str) -> int:
        """End child ``k``'s calls (it exited); returns how many."""
        ringing = [p for p in self.ringing.values() if p.cid >> CID_BITS == k]
        active = [t for t in self.active.values() if t.cid >> CID_BITS == k]
        for pending in ringing:
            self._drop_pending(pending)
        for transport in active:
            transport.end("sip_stack", reason)
            self.active.pop(transport.cid, None)
        return len(ringing) + len(active)

    # ------------------------------------------------------------------ events from the child
    def _on_event(self, k: int, cid: int, ev: dict[str, Any]) -> None:
        kind = ev.get("ev")
        if kind == "ready":
            self.ready[k].set()
            child = self.child_config(k)
            log.info("SIP listening on %s:%s (%s), RTP %d-%d, %d calls%s", self.cfg.host, child["port"],
                     "+".join(self.cfg.transports), child["rtp_port_min"], child["rtp_port_max"], CALLS_PER_PROCESS,
                     f", webhook {decisions.url_for_log(self.cfg.webhook_url)}" if self.cfg.webhook_url else
                     ", no webhook: calls are answered with sip.default_session")
        elif kind == "failed":
            log.error("SIP stack could not start: %s", ev.get("reason"))
        elif kind == "incoming":
            self._incoming(cid, str(ev.get("src", "")), list(ev.get("headers") or []))
        elif kind == "ended":
            self._ended(cid, int(ev.get("code") or 0), str(ev.get("reason") or ""))
        elif kind == "dtmf":
            transport = self.active.get(cid)
            if transport is not None:
                transport.dtmf_in(str(ev.get("digit", "")))
        elif kind == "dtmf_sent":
            transport = self.active.get(cid)
            if transport is not None:
                transport.dtmf_sent(str(ev.get("digits", "")), ev.get("ref"))
        elif kind == "refer":
            self._refer_status(cid, int(ev.get("code") or 0), bool(ev.get("final")))
        elif kind == "error":
            log.warning("SIP call %d: %s failed in PJSIP: %s", cid, ev.get("op"), ev.get("reason"))

    def _incoming(self, cid: int, src: str, headers: list[dict[str, str]]) -> None:
        host = self.state.host
        refusal = decisions.admission(
            src=src, allowed=self.cfg.allowed_networks, draining=self.state.sessions.draining,
            ready=host.ready and not host.failed, free_slots=host.free_slots,
            ringing=len(self.ringing), max_ringing=PENDING_PER_SLOT * max(1, host.max_sessions))
        if refusal is not None:
            code, label = refusal
            self.metrics.calls.labels(result=label).inc()
            self.state.metrics.sessions_rejected.labels(reason=label).inc()
            log.warning("SIP INVITE from %s refused: %d (%s)", decisions.host_of(src), code, label)
            self.send_child(ipc.control(cid, op="answer", code=code))
            return
        token = uuid.uuid4().hex[:24]
        pending = Pending(cid, f"rtc_{token}", f"live_{token}", headers, src, time.monotonic() + self.cfg.accept_timeout_s)
        self.ringing[cid] = pending
        self.pending[pending.call_id] = pending
        self.pending[pending.live_id] = pending
        self.send_child(ipc.control(cid, op="answer", code=180))
        log.info("SIP call %s from %s ringing", pending.call_id, decisions.host_of(src))
        pending.tasks.append(asyncio.create_task(self._deadline(pending), name=f"kame-sip-deadline-{cid}"))
        if not self.cfg.webhook_url:
            session = dict(self.cfg.default_session)
            api = "live" if session.get("type") == "live" else "realtime"
            try:
                self.accept(pending.live_id if api == "live" else pending.call_id, api,
                            {"session": session} if api == "live" else session)
            except AcceptError as exc:
                log.warning("SIP call %s: sip.default_session refused: %s", pending.call_id, exc.message)
                self._finish_pending(pending, 503 if exc.status == 503 else 500, "default_session")
            return
        for event in self.cfg.webhook_events:
            call_id = pending.live_id if event == webhook.LIVE_INCOMING else pending.call_id
            pending.tasks.append(asyncio.create_task(self._post_webhook(pending, event, call_id),
                                                     name=f"kame-sip-webhook-{cid}"))

    async def _deadline(self, pending: Pending) -> None:
        await asyncio.sleep(max(0.0, pending.deadline - time.monotonic()))
        if self.ringing.get(pending.cid) is pending:
            log.warning("SIP call %s not accepted within %.0f s: 480", pending.call_id, self.cfg.accept_timeout_s)
            self._finish_pending(pending, 480, "timeout", cancel_self=False)

    async def _post_webhook(self, pending: Pending, event: str, call_id: str) -> None:
        import httpx

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(5.0), follow_redirects=False)
        url = str(self.cfg.webhook_url)
        secret = self.cfg.webhook_secret.get_secret_value() if self.cfg.webhook_secret else None
        body = webhook.incoming_event(event, call_id, pending.headers)
        msg_id = webhook.message_id()  # the same on every retry, as Standard Webhooks asks
        attempt = 0
        while self.ringing.get(pending.cid) is pending:
            attempt += 1
            try:
                resp = await self._http.post(url, content=body, headers=webhook.signed_headers(secret, body, msg_id))
                if 200 <= resp.status_code < 300:
                    self.metrics.webhooks.labels(result="delivered").inc()
                    return
                problem = f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                problem = exc.__class__.__name__
            self.metrics.webhooks.labels(result="failed").inc()
            wait = decisions.retry_delay(attempt)
            if time.monotonic() + wait >= pending.deadline:
                log.warning("SIP call %s: webhook %s not delivered (%s, %d attempt(s)); giving up at the accept deadline",
                            pending.call_id, event, problem, attempt)
                self.metrics.webhooks.labels(result="gave_up").inc()
                return
            log.info("SIP call %s: webhook %s failed (%s); retrying in %.1f s", pending.call_id, event, problem, wait)
            await asyncio.sleep(wait)

    def _finish_pending(self, pending: Pending, code: int, label: str, *, cancel_self: bool = True) -> None:
        self._drop_pending(pending, cancel_self=cancel_self)
        self.metrics.calls.labels(result=label).inc()
        self.send_child(ipc.control(pending.cid, op="answer", code=code))

    def _drop_pending(self, pending: Pending, *, cancel_self: bool = True) -> None:
        self.ringing.pop(pending.cid, None)
        self.pending.pop(pending.call_id, None)
        self.pending.pop(pending.live_id, None)
        current = asyncio.current_task()
        for task in pending.tasks:
            if task is not current or cancel_self:
                if task is not current:
                    task.cancel()

    def _ended(self, cid: int, code: int, reason: str) -> None:
        pending = self.ringing.get(cid)
        if pending is not None:
            self._drop_pending(pending)
            log.info("SIP call %s ended before its accept (%d %s)", pending.call_id, code, reason)
            return
        transport = self.active.pop(cid, None)
        if transport is not None:
            transport.peer_ended(code, reason)

    def _refer_status(self, cid: int, code: int, final: bool) -> None:
        transport = self.active.get(cid)
        if transport is None or not final and code < 300:
            return
        if 200 <= code < 300:
            self.metrics.refers.labels(result="transferred").inc()
            log.info("SIP call %s transferred (%d)", transport.call_id, code)
            transport.end("transferred", f"transferred ({code})")
        elif code >= 300:
            self.metrics.refers.labels(result="failed").inc()
            log.warning("SIP call %s: transfer failed (%d)", transport.call_id, code)

    # ------------------------------------------------------------------ call control (HTTP routes)
    def find(self, call_id: str, api: str) -> Pending | SipTransport | None:
        pending = self.pending.get(call_id[:64])
        if pending is not None:
            return pending if (pending.call_id if api == "realtime" else pending.live_id) == call_id else None
        for transport in self.active.values():
            if transport.call_id == call_id and transport.api == api:
                return transport
        return None

    def accept(self, call_id: str, api: str, body: Any) -> None:
        """Answer the ringing call ``call_id`` with this session (``body``: a Realtime session config, or the
        Live API's ``{"session": {...}}``) and run it; :class:`AcceptError` when it cannot be."""
        pending = self.find(call_id, api)
        if pending is None:
            raise AcceptError(404, "No such call (it ended, was answered, or never existed).", "call_not_found")
        if not isinstance(pending, Pending):
            raise AcceptError(409, "The call is already accepted.", "call_already_accepted")
        wire, settings, session_id = self._wire(api, body)
        host = self.state.host
        if self.state.sessions.draining or host.free_slots <= 0:
            busy = host.free_slots <= 0
            self._finish_pending(pending, 486 if busy else 503, "busy" if busy else "draining")
            raise AcceptError(503, "The server is full; the caller was told Busy Here (486)." if busy else
                              "The server is shutting down; the caller was told 503.", "server_full" if busy else "server_draining")
        self._drop_pending(pending)
        transport = SipTransport(call_id=call_id, cid=pending.cid, api=api, send_child=self.send_child,
                                 metrics=self.metrics, input_delay_s=self.cfg.input_delay_s)
        if api == "live":
            transport.inject({"type": "websocket.receive", "text": json.dumps({"type": "session.start", "session": body["session"]})})
        self.active[pending.cid] = transport
        self.send_child(ipc.control(pending.cid, op="answer", code=200))
        self.metrics.calls.labels(result="answered").inc()
        self._launch(transport, wire, settings, session_id, api)

    def _wire(self, api: str, body: Any) -> tuple[Wire, SessionSettings, str]:
        from kame.server.webrtc.signaling import _session_settings
        from kame.vocab import MOSHI_VOCAB

        session_id = uuid.uuid4().hex[:12]
        state = self.state
        if api == "live":
            return self._live_wire(body, session_id)
        problem = decisions.realtime_accept_problem(body)
        if problem is not None:
            raise AcceptError(400, problem, "invalid_value")
        settings, info, problem = _session_settings(state, decisions.without_phone_format(body), None, session_id)
        if problem is not None:
            raise AcceptError(400, problem, "invalid_value")
        settings = replace(settings, record=settings.record and state.cfg.server.record_dir is not None)
        from kame.server.wires.realtime.rtp import RealtimeRtpWire

        host = state.host
        vocab = host.models.vocab if host.models is not None else MOSHI_VOCAB
        return RealtimeRtpWire(info, settings, host.frame_size, vocab), settings, session_id

    def _live_wire(self, body: Any, session_id: str) -> tuple[Wire, SessionSettings, str]:
        from kame.server.offers import live_info, live_wire_args
        from kame.server.wires.live.channel import parse_permissions
        from kame.server.wires.live.config import parse_start
        from kame.server.wires.live.events import LiveError
        from kame.server.wires.live.rtp import LiveRtpWire
        from kame.server.wires.live.wire import KameLiveSettings, live_settings
        from kame.session.settings import SessionSettings

        session = body.get("session") if isinstance(body, dict) else None
        if not isinstance(session, dict):
            raise AcceptError(400, "The body needs a \"session\" object (type \"live\" and the model).", "invalid_value")
        session = decisions.without_phone_format(session)
        body["session"] = session
        try:
            permissions = parse_permissions(None)
            info = live_info(self.state, session_id, webrtc=True, client=None)
            settings = live_settings(SessionSettings(), KameLiveSettings())
            wire = LiveRtpWire(info, settings, permissions=permissions, **live_wire_args(self.state))
            parse_start(session, wire.live.info)
        except LiveError as exc:
            raise AcceptError(400, exc.message.rstrip(".") + ".", exc.code) from None
        return wire, settings, session_id

    def _launch(self, transport: SipTransport, wire: Wire, settings: SessionSettings, session_id: str, api: str) -> None:
        from kame.server.webrtc.signaling import Call, calls_of

        call = Call(transport.call_id, None, transport, None, kind="live" if api == "live" else "realtime")  # type: ignore[arg-type]
        calls_of(self.state).live[call.id] = call
        call.task = asyncio.create_task(self._run(call, transport, wire, settings, session_id), name=f"kame-sip-{call.id}")

    async def _run(self, call: Call, transport: SipTransport, wire: Wire, settings: SessionSettings,
                   session_id: str) -> None:
        from kame.server.runtime.route import run_session
        from kame.server.webrtc.signaling import calls_of

        slog = session_logger(session_id)
        slog.info("session accepted", extra={"peer": "sip", "protocol": wire.protocol, "call": call.id})

        def started(runtime: SessionRuntime) -> None:
            call.runtime = runtime

        try:
            await run_session(self.state, transport, wire, settings, session_id, slog,
                              input_buffer_s=self.state.cfg.server.input_buffer_s, started=started)
        except Exception:
            slog.exception("SIP call %s failed", call.id)
        finally:
            await transport.shutdown()
            self.active.pop(transport.cid, None)
            calls_of(self.state).live.pop(call.id, None)

    def reject(self, call_id: str, api: str, status_code: int) -> None:
        pending = self.find(call_id, api)
        if not isinstance(pending, Pending):
            raise AcceptError(404, "No ringing call with this id (it ended, was answered, or never existed).",
                              "call_not_found")
        log.info("SIP call %s rejected: %d", pending.call_id, status_code)
        self._finish_pending(pending, status_code, "rejected")

    def refer(self, call_id: str, api: str, target: str) -> None:
        found = self.find(call_id, api)
        if found is None:
            raise AcceptError(404, "No such call (it ended, or never existed).", "call_not_found")
        if isinstance(found, Pending):
            raise AcceptError(400, "The call is not answered yet: accept it before transferring it.", "call_not_active")
        log.info("SIP call %s: REFER to %s", call_id, decisions.uri_for_log(target))
        self.send_child(ipc.control(found.cid, op="refer", target=target))

    def hangup_pending(self, pending: Pending) -> None:
        log.info("SIP call %s hung up before its accept", pending.call_id)
        self._finish_pending(pending, 603, "hangup")


def sip_of(state: AppState) -> SipService | None:
    """The app's SIP service, or None when ``sip.port`` is unset."""
    service: SipService | None = getattr(state, "_sip", None)
    return service


def start_sip(state: AppState) -> SipService | None:
    """Start the SIP service when ``sip.port`` is set (in the app's lifespan); None otherwise."""
    if state.cfg.sip.port is None:
        return None
    service = SipService(state)
    if state.cfg.sip.webhook_url and state.cfg.sip.webhook_secret is None:
        log.warning("sip.webhook_url is set without sip.webhook_secret: webhooks go unsigned, and apps that verify "
                    "them (client.webhooks.unwrap) refuse them")
    state._sip = service  # type: ignore[attr-defined]
    service.start()
    return service
