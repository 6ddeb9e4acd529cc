"""The SIP child process: PJSIP (``pjsua2``) answering phones, talking to ``kame serve`` over one socket.

``kame serve`` starts it (:mod:`~kame.server.telephony.stack`) as ``python -m kame.server.telephony.child
FD CONFIG_JSON``. PJSIP does SIP (UDP, TCP), SDP, RTP, the codecs (PCMU, PCMA, G.722), its adaptive
jitter buffer and RFC 4733 DTMF; this only relays: call events and 20 ms PCM frames at 8 kHz
(:mod:`~kame.server.telephony.ipc`) out, commands and the reply's frames in. Why a child: PJSIP calls
back on its own threads, and pjsua2 objects freed by Python's collector on a thread PJSIP does not know
abort the process; here the collector is off except on the main thread, every PJSIP call is made on the
main thread (``mainThreadOnly``), and a crash ends only this process (the parent restarts it).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections import deque
from typing import Any

import pjsua2 as pj

from kame.server.telephony import ipc

log = logging.getLogger("kame.server.sip.child")

#: Reply frames held per call (the parent paces them; more means it ran ahead: the oldest are dropped).
MAX_OUT_FRAMES = 25
SILENCE = bytes(ipc.FRAME_BYTES)
LOG_LINES_PER_S = 5
_STATES_ENDED = (pj.PJSIP_INV_STATE_DISCONNECTED,)


class Relay:
    """The socket to the parent: a writer thread drains :attr:`out`, a reader thread fills :attr:`commands`
    and the calls' reply frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.commands: queue.SimpleQueue[tuple[int, dict[str, Any]] | None] = queue.SimpleQueue()
        self.replies: dict[int, deque[bytes]] = {}
        self.closed = threading.Event()

    def send(self, cid: int, **fields: Any) -> None:
        self.out.put(ipc.control(cid, **fields))

    def write_loop(self) -> None:
        while True:
            frame = self.out.get()
            if frame is None:
                return
            try:
                self.sock.sendall(frame)
            except OSError:
                self.closed.set()
                return

    def read_loop(self) -> None:
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= ipc.HEADER.size:
                    kind, cid, size = ipc.HEADER.unpack_from(buf)
                    if len(buf) < ipc.HEADER.size + size:
                        break
                    payload = buf[ipc.HEADER.size:ipc.HEADER.size + size]
                    buf = buf[ipc.HEADER.size + size:]
                    if kind == ipc.AUDIO:
                        frames = self.replies.get(cid)
                        if frames is not None:
                            for i in range(0, len(payload) - ipc.FRAME_BYTES + 1, ipc.FRAME_BYTES):
                                frames.append(payload[i:i + ipc.FRAME_BYTES])
                    else:
                        self.commands.put((cid, json.loads(payload)))
        except OSError:
            pass
        self.closed.set()
        self.commands.put(None)


class Port(pj.AudioMediaPort):
    """One call's audio in the conference bridge: what the caller says goes to the parent; the parent's
    frames are played back (silence when none is waiting). Called on PJSIP's media clock thread."""

    def __init__(self, cid: int, relay: Relay) -> None:
        super().__init__()
        self.cid = cid
        self.relay = relay
        self.frames: deque[bytes] = deque(maxlen=MAX_OUT_FRAMES)
        relay.replies[cid] = self.frames

    def onFrameReceived(self, frame: Any) -> None:  # noqa: N802 - pjsua2's name
        if frame.type == pj.PJMEDIA_FRAME_TYPE_AUDIO and frame.size:
            self.relay.out.put(ipc.audio(self.cid, bytes(frame.buf)))

    def onFrameRequested(self, frame: Any) -> None:  # noqa: N802
        data = self.frames.popleft() if self.frames else SILENCE
        frame.type = pj.PJMEDIA_FRAME_TYPE_AUDIO
        frame.buf = pj.ByteVector(data)
        frame.size = len(data)


class Call(pj.Call):
    """An incoming call: its state and media reported to the parent, its audio through a :class:`Port`."""

    def __init__(self, ua: UserAgent, account: pj.Account, call_id: int, cid: int) -> None:
        super().__init__(account, call_id)
        self.ua = ua
        self.cid = cid
        self.port: Port | None = None
        self.media: Any = None
        self.ended = False

    def onCallState(self, prm: Any) -> None:  # noqa: N802
        info = self.getInfo()
        if info.state == pj.PJSIP_INV_STATE_CONFIRMED:
            self.ua.relay.send(self.cid, ev="confirmed")
        if info.state in _STATES_ENDED and not self.ended:
            self.ended = True
            self.ua.relay.send(self.cid, ev="ended", code=info.lastStatusCode, reason=info.lastReason[:120])
            self.ua.ended.append(self.cid)

    def onCallMediaState(self, prm: Any) -> None:  # noqa: N802
        info = self.getInfo()
        for index, media in enumerate(info.media):
            if media.type != pj.PJMEDIA_TYPE_AUDIO or media.status != pj.PJSUA_CALL_MEDIA_ACTIVE or self.port:
                continue
            self.media = self.getAudioMedia(index)
            port = Port(self.cid, self.ua.relay)
            fmt = pj.MediaFormatAudio()
            fmt.init(pj.PJMEDIA_FORMAT_PCM, ipc.RATE, 1, 20000, 16)
            port.createPort(f"kame{self.cid}", fmt)
            self.media.startTransmit(port)
            port.startTransmit(self.media)
            self.port = port
            codec = ""
            try:
                codec = self.getStreamInfo(index).codecName
            except pj.Error:
                pass
            self.ua.relay.send(self.cid, ev="media", codec=str(codec).lower())

    def onDtmfDigit(self, prm: Any) -> None:  # noqa: N802
        self.ua.relay.send(self.cid, ev="dtmf", digit=str(prm.digit)[:1])

    def onCallTransferStatus(self, prm: Any) -> None:  # noqa: N802
        self.ua.relay.send(self.cid, ev="refer", code=prm.statusCode, final=bool(prm.finalNotify))


class Account(pj.Account):
    def __init__(self, ua: UserAgent) -> None:
        super().__init__()
        self.ua = ua

    def onIncomingCall(self, prm: Any) -> None:  # noqa: N802
        self.ua.incoming(self, prm)


class LogWriter(pj.LogWriter):
    """PJSIP's warnings and errors (malformed SIP, ...) to stderr, the server's log: one line each, at most
    :data:`LOG_LINES_PER_S` a second (a flood of bad packets is summed up, not copied)."""

    def __init__(self) -> None:
        super().__init__()
        self.second = 0
        self.lines = 0
        self.suppressed = 0

    def write(self, entry: Any) -> None:
        text = " ".join(str(entry.msg).split())
        if not text:
            return
        now = int(time.monotonic())
        if now != self.second:
            if self.suppressed:
                print(f"kame sip child: pjsip: {self.suppressed} more message(s) suppressed", file=sys.stderr, flush=True)
            self.second, self.lines, self.suppressed = now, 0, 0
        self.lines += 1
        if self.lines > LOG_LINES_PER_S:
            self.suppressed += 1
            return
        print(f"kame sip child: pjsip: {text[:300]}", file=sys.stderr, flush=True)


class UserAgent:
    """The endpoint, its transports and account, and the calls by the parent's number."""

    def __init__(self, cfg: dict[str, Any], relay: Relay) -> None:
        self.cfg = cfg
        self.relay = relay
        self.calls: dict[int, Call] = {}
        self.ended: list[int] = []
        self.next_cid = int(cfg.get("first_cid", 0)) + 1
        self.ep = pj.Endpoint()
        self.ep.libCreate()
        ep_cfg = pj.EpConfig()
        ep_cfg.uaConfig.threadCnt = 0
        ep_cfg.uaConfig.mainThreadOnly = True
        ep_cfg.uaConfig.maxCalls = int(cfg["max_calls"])
        ep_cfg.uaConfig.userAgent = "kame"
        ep_cfg.logConfig.level = 2
        ep_cfg.logConfig.consoleLevel = 2
        ep_cfg.logConfig.decor = 0
        self.writer = LogWriter()
        ep_cfg.logConfig.writer = self.writer
        med = ep_cfg.medConfig
        med.clockRate = ipc.RATE
        med.sndClockRate = ipc.RATE
        med.channelCount = 1
        med.audioFramePtime = 20
        med.noVad = True
        med.ecTailLen = 0
        med.sndAutoCloseTime = -1
        self.ep.libInit(ep_cfg)
        for kind in cfg["transports"]:
            tcfg = pj.TransportConfig()
            tcfg.port = int(cfg["port"])
            tcfg.boundAddress = cfg["host"]
            if cfg.get("public_address"):
                tcfg.publicAddress = cfg["public_address"]
            self.ep.transportCreate(pj.PJSIP_TRANSPORT_UDP if kind == "udp" else pj.PJSIP_TRANSPORT_TCP, tcfg)
        self.ep.libStart()
        self.ep.audDevManager().setNullDev()
        wanted = [c.lower() for c in cfg.get("codecs") or ()]
        for info in self.ep.codecEnum2():  # only the configured codecs, preferred first (0 disables one)
            name = info.codecId.lower().split("/", 1)[0]
            self.ep.codecSetPriority(info.codecId, 255 - wanted.index(name) if name in wanted else 0)
        acfg = pj.AccountConfig()
        acfg.idUri = f"sip:kame@{cfg.get('public_address') or cfg['host']}:{cfg['port']}"
        rtp = acfg.mediaConfig.transportConfig
        rtp.port = int(cfg["rtp_port_min"])
        rtp.portRange = max(0, int(cfg["rtp_port_max"]) - int(cfg["rtp_port_min"]))
        rtp.boundAddress = cfg["host"]
        if cfg.get("public_address"):
            rtp.publicAddress = cfg["public_address"]
        self.account = Account(self)
        self.account.create(acfg, True)

    # ------------------------------------------------------------------ PJSIP callbacks (main thread)
    def incoming(self, account: Account, prm: Any) -> None:
        cid = self.next_cid
        self.next_cid += 1
        call = Call(self, account, prm.callId, cid)
        self.calls[cid] = call
        info = call.getInfo()
        src = str(prm.rdata.srcAddress)
        self.relay.send(cid, ev="incoming", src=src, headers=sip_headers(str(prm.rdata.wholeMsg)),
                        local=str(info.localUri)[:256], remote=str(info.remoteUri)[:256])

    # ------------------------------------------------------------------ commands (main thread)
    def command(self, cid: int, cmd: dict[str, Any]) -> None:
        call = self.calls.get(cid)
        op = cmd.get("op")
        if call is None or call.ended:
            if op in ("answer", "refer", "dtmf"):
                self.relay.send(cid, ev="gone", op=op)
            return
        prm = pj.CallOpParam(True)
        try:
            if op == "answer":
                code = int(cmd["code"])
                prm.statusCode = code
                if code < 300:
                    call.answer(prm)
                else:
                    if cmd.get("reason"):
                        prm.reason = str(cmd["reason"])[:64]
                    call.hangup(prm)
            elif op == "hangup":
                call.hangup(prm)
            elif op == "refer":
                call.xfer(str(cmd["target"]), prm)
            elif op == "dtmf":
                call.dialDtmf(str(cmd["digits"]))
                self.relay.send(cid, ev="dtmf_sent", digits=str(cmd["digits"]), ref=cmd.get("ref"))
        except pj.Error as exc:
            self.relay.send(cid, ev="error", op=str(op), status=exc.status, reason=str(exc.reason)[:200])

    def reap(self) -> None:
        """Free the calls that ended (their port leaves the bridge first), on the main thread."""
        while self.ended:
            cid = self.ended.pop()
            call = self.calls.pop(cid, None)
            self.relay.replies.pop(cid, None)
            if call is not None and call.port is not None:
                try:
                    call.port.stopTransmit(call.media)
                except pj.Error:
                    pass
                call.port = None

    def close(self) -> None:
        for call in self.calls.values():
            if not call.ended:
                try:
                    call.hangup(pj.CallOpParam(True))
                except pj.Error:
                    pass
        self.calls.clear()
        self.account.shutdown()
        del self.account
        self.ep.libDestroy()


_SKIPPED_HEADERS = frozenset({"authorization", "proxy-authorization"})


def sip_headers(message: str) -> list[dict[str, str]]:
    """The INVITE's headers as OpenAI's webhook lists them: names, values, order and repeats kept (lines
    folded by PJSIP's printer are single lines), authorization headers left out. PJSIP parsed the message;
    this only lists the header lines it printed."""
    head = message.split("\r\n\r\n", 1)[0].split("\r\n")[1:]
    out: list[dict[str, str]] = []
    for line in head:
        name, sep, value = line.partition(":")
        if not sep or name.strip().lower() in _SKIPPED_HEADERS:
            continue
        out.append({"name": name.strip()[:128], "value": value.strip()[:1024]})
        if len(out) >= 64:
            break
    return out


def main() -> None:
    fd = int(sys.argv[1])
    cfg = json.loads(sys.argv[2])
    gc.disable()  # collected only on the main thread, below: pjsua2 objects must die on a PJSIP thread
    sock = socket.socket(fileno=fd)
    relay = Relay(sock)
    threading.Thread(target=relay.write_loop, name="sip-out", daemon=True).start()
    try:
        ua = UserAgent(cfg, relay)
    except pj.Error as exc:
        relay.send(0, ev="failed", reason=f"{exc.title}: {exc.reason}"[:300])
        time.sleep(0.2)
        sys.exit(3)
    relay.send(0, ev="ready", port=int(cfg["port"]))
    threading.Thread(target=relay.read_loop, name="sip-in", daemon=True).start()
    last_gc = time.monotonic()
    while not relay.closed.is_set():
        ua.ep.libHandleEvents(10)
        while True:
            try:
                item = relay.commands.get_nowait()
            except queue.Empty:
                break
            if item is None:
                break
            ua.command(*item)
        ua.reap()
        if time.monotonic() - last_gc > 2.0:
            gc.collect()
            last_gc = time.monotonic()
    ua.close()
    relay.out.put(None)
    os._exit(0)


if __name__ == "__main__":
    main()
