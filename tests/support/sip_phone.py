"""A SIP phone for tests: PJSIP's own user agent (``pjsua2``), run as a subprocess, calling over loopback.

``python tests/support/sip_phone.py CONFIG_JSON`` places one call to ``uri`` (UDP or TCP), plays ``play``
(a WAV file, e.g. espeak-ng's speech) into it once the call is up, records what it hears to ``record``
(WAV), runs ``actions`` at their times after the answer (``{"at": 2.0, "dtmf": "5"}``, ``{"at": 6,
"hangup": true}``), follows a REFER (PJSIP dials the target: a transfer) and prints one JSON line per
event on stdout (``state``, ``media``, ``dtmf``, ``transfer``, ``done``). The SIP, SDP, RTP, codec and
DTMF code is PJSIP's; this only drives it. It stops at ``max_s`` at the latest.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pjsua2 as pj


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


class Phone:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.ep = pj.Endpoint()
        self.ep.libCreate()
        ep_cfg = pj.EpConfig()
        ep_cfg.uaConfig.threadCnt = 0
        ep_cfg.uaConfig.mainThreadOnly = True
        ep_cfg.logConfig.level = 1
        ep_cfg.logConfig.consoleLevel = 1
        ep_cfg.medConfig.sndAutoCloseTime = -1
        ep_cfg.medConfig.noVad = True
        ep_cfg.medConfig.clockRate = 8000
        self.ep.libInit(ep_cfg)
        tcfg = pj.TransportConfig()
        tcfg.port = 0
        tcfg.boundAddress = cfg.get("bind", "127.0.0.1")
        kinds = {"tcp": pj.PJSIP_TRANSPORT_TCP, "tls": pj.PJSIP_TRANSPORT_TLS}
        if cfg.get("transport") == "tls":  # the phone's side of a TLS hop (the proxy in front of kame)
            tcfg.tlsConfig.certFile = cfg["cert"]
            tcfg.tlsConfig.privKeyFile = cfg["key"]
            tcfg.tlsConfig.verifyServer = False
            tcfg.tlsConfig.method = pj.PJSIP_TLSV1_2_METHOD
        self.ep.transportCreate(kinds.get(cfg.get("transport", ""), pj.PJSIP_TRANSPORT_UDP), tcfg)
        self.ep.libStart()
        self.ep.audDevManager().setNullDev()
        codec = cfg.get("codec")
        if codec:
            for info in self.ep.codecEnum2():
                self.ep.codecSetPriority(info.codecId, 255 if info.codecId.lower().startswith(codec.lower() + "/") else 0)
        acfg = pj.AccountConfig()
        acfg.idUri = "sip:phone@127.0.0.1"
        acfg.mediaConfig.transportConfig.boundAddress = cfg.get("bind", "127.0.0.1")
        self.account = pj.Account()
        self.account.create(acfg, True)
        self.calls: list[PhoneCall] = []
        self.answered_at: float | None = None
        self.done = False

    def dial(self, uri: str) -> PhoneCall:
        call = PhoneCall(self, self.account)
        prm = pj.CallOpParam(True)
        headers = self.cfg.get("headers") or {}
        for name, value in headers.items():
            h = pj.SipHeader()
            h.hName = name
            h.hValue = value
            prm.txOption.headers.append(h)
        call.makeCall(uri, prm)
        self.calls.append(call)
        return call

    def run(self) -> None:
        self.dial(self.cfg["uri"])
        actions = sorted(self.cfg.get("actions") or [], key=lambda a: a["at"])
        deadline = time.monotonic() + float(self.cfg.get("max_s", 30))
        while time.monotonic() < deadline and not self.done:
            self.ep.libHandleEvents(10)
            if self.answered_at is None or not actions:
                continue
            if time.monotonic() - self.answered_at >= actions[0]["at"]:
                action = actions.pop(0)
                live = [c for c in self.calls if c.active]
                target = live[-1] if live else self.calls[0]
                try:
                    if "dtmf" in action:
                        target.dialDtmf(action["dtmf"])
                        emit(event="dtmf_sent", digits=action["dtmf"])
                    elif action.get("hangup"):
                        target.hangup(pj.CallOpParam(True))
                except pj.Error as exc:
                    emit(event="error", reason=exc.reason)
        for c in self.calls:
            c.stop()
        emit(event="done")
        for c in self.calls:
            if c.active:
                try:
                    c.hangup(pj.CallOpParam(True))
                except pj.Error:
                    pass
        for _ in range(30):
            self.ep.libHandleEvents(10)
        self.calls.clear()
        self.account.shutdown()
        del self.account
        self.ep.libDestroy()


class PhoneCall(pj.Call):
    def __init__(self, phone: Phone, account: pj.Account, call_id: int = pj.PJSUA_INVALID_ID) -> None:
        super().__init__(account, call_id)
        self.phone = phone
        self.active = True
        self.player: Any = None
        self.recorder: Any = None

    def onCallState(self, prm: Any) -> None:  # noqa: N802
        info = self.getInfo()
        emit(event="state", state=info.stateText, code=info.lastStatusCode, reason=info.lastReason,
             call=self.phone.calls.index(self) if self in self.phone.calls else -1)
        if info.state == pj.PJSIP_INV_STATE_CONFIRMED and self.phone.answered_at is None:
            self.phone.answered_at = time.monotonic()
        if info.state == pj.PJSIP_INV_STATE_DISCONNECTED:
            self.active = False
            if not any(c.active for c in self.phone.calls) and not self.phone.cfg.get("stay_after_transfer_s"):
                self.phone.done = True
            elif not any(c.active for c in self.phone.calls):
                self.phone.done = True

    def onCallMediaState(self, prm: Any) -> None:  # noqa: N802
        info = self.getInfo()
        for index, media in enumerate(info.media):
            if media.type != pj.PJMEDIA_TYPE_AUDIO or media.status != pj.PJSUA_CALL_MEDIA_ACTIVE:
                continue
            aud = self.getAudioMedia(index)
            index_of = self.phone.calls.index(self) if self in self.phone.calls else 0
            emit(event="media", codec=str(self.getStreamInfo(index).codecName).lower(), call=index_of)
            if self.phone.cfg.get("play") and self.player is None:
                self.player = pj.AudioMediaPlayer()
                self.player.createPlayer(self.phone.cfg["play"], pj.PJMEDIA_FILE_NO_LOOP)
                self.player.startTransmit(aud)
            record = self.phone.cfg.get("record")
            if record and self.recorder is None:
                self.recorder = pj.AudioMediaRecorder()
                self.recorder.createRecorder(record if index_of == 0 else record.replace(".wav", f".{index_of}.wav"))
                aud.startTransmit(self.recorder)

    def onDtmfDigit(self, prm: Any) -> None:  # noqa: N802
        emit(event="dtmf", digit=prm.digit)

    def onCallTransferRequest(self, prm: Any) -> None:  # noqa: N802
        emit(event="transfer", target=prm.dstUri)
        prm.statusCode = 202
        new = PhoneCall(self.phone, self.phone.account)
        self.phone.calls.append(new)
        prm.newCall = new

    def onCallTransferStatus(self, prm: Any) -> None:  # noqa: N802
        emit(event="transfer_status", code=prm.statusCode, final=bool(prm.finalNotify))

    def onCallReplaced(self, prm: Any) -> None:  # noqa: N802
        pass

    def stop(self) -> None:
        self.player = None
        self.recorder = None  # closing the recorder writes the WAV header's sizes


def main() -> None:
    Phone(json.loads(sys.argv[1])).run()


if __name__ == "__main__":
    main()
