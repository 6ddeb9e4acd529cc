"""The websocket endpoints: one :class:`~kame.server.runtime.route.WireRoute` per wire.

Adding a protocol: write its wire (a pure module under :mod:`kame.server.wires`),
describe it here, list it in :data:`WIRES`.
"""

from __future__ import annotations

import time
from dataclasses import replace

from fastapi import WebSocket

from kame.server.access.admission import Admitted
from kame.server.offers import live_info, live_wire_args, realtime_info
from kame.server.runtime.route import WireRoute
from kame.server.runtime.wire import Wire
from kame.server.state import AppState
from kame.server.webrtc.sideband import serve_sideband
from kame.server.wires.live import wire as live
from kame.server.wires.moshi import wire as moshi
from kame.server.wires.moshi.params import ChatParams
from kame.server.wires.moshi.server_info import session_server_info
from kame.server.wires.realtime import wire as realtime
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB


def _recording(state: AppState) -> bool:
    return state.cfg.server.record_dir is not None


def open_chat(state: AppState, admitted: Admitted, ws: WebSocket) -> tuple[Wire, SessionSettings]:

    params = admitted.wire_params if isinstance(admitted.wire_params, ChatParams) else ChatParams()
    settings = params.apply(replace(admitted.params.settings, record=_recording(state)))
    info = session_server_info(state.host, settings)
    vocab = state.host.models.vocab if state.host.models is not None else MOSHI_VOCAB
    catalog = getattr(state.host.models, "voices", None)
    has_voices = catalog is not None and bool(catalog.names)
    notices = params.notices(has_voices=has_voices)
    if catalog is not None and has_voices:
        # PersonaPlex's own server falls back to its default voice rather than refuse: so does this wire
        voice, unknown = catalog.choose(params.voice_prompt)
        settings = replace(settings, voice=voice)
        if unknown is not None:
            notices.insert(0, f"voice_prompt: {unknown}")
    for notice in notices:
        admitted.log.info("chat parameter: %s", notice)
    wire = moshi.MoshiWire(state.host.sample_rate, state.host.frame_size, server_info=info,
                           max_duration_s=state.cfg.server.max_duration_s, vocab=vocab,
                           kame_messages=params.kame_messages, notices=notices, kame_resume=params.kame_resume)
    return wire, settings


def open_realtime(state: AppState, admitted: Admitted, ws: WebSocket) -> tuple[Wire, SessionSettings]:

    host = state.host
    model = (ws.query_params.get("model") or "kame")[:64]
    info = realtime_info(state, admitted.session_id, model)
    settings = replace(admitted.params.settings, record=_recording(state))
    if admitted.grant is not None:  # an ek_ key: its session config starts the session and bounds it
        info = admitted.grant.narrow(info)
        settings = replace(admitted.grant.settings, record=_recording(state) and admitted.grant.settings.record)
    if admitted.restored is not None:  # resumed from another replica: the settings it had there
        settings = admitted.restored
    vocab = host.models.vocab if host.models is not None else MOSHI_VOCAB
    kame_events = realtime.kame_events_query(ws.query_params.get("kame_events"))
    return realtime.RealtimeWire(info, settings, host.frame_size, vocab, kame_events=kame_events), settings


async def realtime_sideband(ws: WebSocket) -> bool:
    """``/v1/realtime?call_id=``: a trusted server joins a WebRTC call (False: not a sideband request)."""
    if "call_id" not in ws.query_params:
        return False

    await serve_sideband(ws)
    return True


CHAT = WireRoute(protocol=moshi.PROTOCOL, path=moshi.PATH, open=open_chat, refusal=moshi.refusal, send_reason=True,
                 params=ChatParams.parse)
REALTIME = WireRoute(
    protocol=realtime.PROTOCOL,
    path=realtime.PATH,
    open=open_realtime,
    refusal=realtime.refusal,
    input_buffer_s=lambda state: state.cfg.server.input_buffer_s,
    ephemeral_keys=True,
    sideband=realtime_sideband,
)


def open_live(state: AppState, admitted: Admitted, ws: WebSocket) -> tuple[Wire, SessionSettings]:
    settings = live.live_settings(admitted.params.settings, live.KameLiveSettings())
    kame_events = realtime.kame_events_query(ws.query_params.get("kame_events"))  # the resume messages' opt-in
    wire = live.LiveWire(live_info(state, admitted.session_id), settings, kame_events=kame_events,
                         **live_wire_args(state))
    if admitted.restored is not None:  # resumed from another replica: its config replayed, its settings
        settings = wire.restore(admitted.restored_wire or {}, admitted.restored, time.monotonic())
    return wire, settings


LIVE = WireRoute(
    protocol=live.PROTOCOL,
    path=live.PATH,
    open=open_live,
    refusal=live.refusal,
    input_buffer_s=lambda state: state.cfg.server.input_buffer_s,
)
#: Every websocket endpoint, in the order docs/protocol.md describes them.
WIRES = (CHAT, REALTIME, LIVE)
