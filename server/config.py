"""The server's settings (``server.*``, ``log.*``, ``sip.*``) and the whole config: the core's plus them.

:class:`AppConfig` is what every ``kame`` command loads (:func:`load_app_config`): a YAML
file shared by ``kame serve`` and ``kame run`` may hold every section. The core
(:mod:`kame.config`) never imports this module.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from kame.config import KameConfig, load_config
from kame.server.telephony.config import SipConfig

log = logging.getLogger("kame.config")


class WebRtcIceServer(BaseModel):
    """A STUN or TURN server, as a browser's ``RTCIceServer``: TURN needs the user and credential."""

    model_config = ConfigDict(extra="forbid")
    urls: list[str] | str = Field(description="stun:host:port, turn:host:port?transport=udp|tcp or turns:host:port.")
    username: str | None = None
    credential: SecretStr | None = Field(None, description="TURN password (a secret: never logged).")

    def url_list(self) -> list[str]:
        return [self.urls] if isinstance(self.urls, str) else list(self.urls)


class ServerConfig(BaseModel):
    """Where the server listens, who may connect, and how long sessions live."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Listen address.")
    port: int = Field(8998, ge=0, le=65535, description="Listen port.")
    max_sessions: int | None = Field(  # always None once AppConfig is validated
        None,
        ge=1,
        le=256,
        description="Deprecated: set frontend.batch_size (the same number: concurrent sessions = engine slots); "
        "a value here is moved there with a warning.",
    )
    auth_token: SecretStr | None = Field(
        None,
        description="Optional bearer token (env KAME_AUTH_TOKEN): Authorization header, `token` query "
        "parameter or websocket subprotocol `openai-insecure-api-key.<token>`.",
    )
    ephemeral_key_secret: SecretStr | None = Field(
        None,
        description="Signs the ek_ keys of /v1/realtime/client_secrets: give every replica the same one so that "
        "a key minted by one opens sessions on all (default: derived from auth_token, so replicas sharing "
        "a token share it; with no token, random per process). Changing it revokes every key.",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed to open sessions, e.g. https://app.example.com (empty: any).",
    )
    idle_timeout_s: float = Field(
        30.0, gt=0, description="A session that sent no audio for this long is closed."
    )
    max_duration_s: float = Field(
        3600.0,
        ge=0,
        description="Longest session in seconds; it is closed after this (an hour by default, as OpenAI's "
        "Realtime API). 0: no cap (the Live API's expires_at is then null, and no duration notice is sent).",
    )
    duration_warning_s: float = Field(
        30.0,
        ge=0,
        description="A notice (/api/chat: a 0x05 text message) warns the client this long before max_duration_s "
        "(at once if the session is shorter).",
    )
    drain_grace_s: float = Field(
        2.0,
        ge=0,
        le=3600,
        description="On SIGTERM: how long live sessions may run on after being told the server is ending "
        "(kame.session.ending / a 0x05 notice) before they are closed with 1001; admission stops at once. "
        "The default keeps the whole shutdown inside Docker's 10 s grace period; on Kubernetes up to an hour "
        "(with terminationGracePeriodSeconds above drain_grace_s + drain_timeout_s + 5).",
    )
    drain_timeout_s: float = Field(
        3.0,
        ge=0,
        le=5.0,
        description="On SIGTERM, after drain_grace_s: how long the closed sessions get to finish their close "
        "handshake before the process exits.",
    )
    # -- resume (issue 60): server/runtime/resume.py, server/runtime/store.py
    resume_grace_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="How long a resumable session (one whose client asked for kame's events) is held after its "
        "connection dropped: the client reconnects with ?resume=HANDLE within it and goes on (0: no resume).",
    )
    resume_store_url: SecretStr | None = Field(
        None,
        description="A Redis (or Valkey) URL, e.g. redis://:PASSWORD@redis:6379/0, where a draining replica "
        "writes its resumable sessions' conversation state (conversation text: protect it) so that another "
        "replica resumes them; unset: resume works within one replica. A secret: never logged.",
    )
    resume_store_ttl_s: float = Field(
        120.0,
        gt=0,
        le=86400,
        description="How long a session's state stays in the store (each entry's time to live) after a drain "
        "wrote it.",
    )
    warmup_steps: int = Field(
        4, ge=0, le=100, description="Engine ticks on every slot at start, before the server reports ready."
    )
    send_queue_frames: int = Field(
        25,
        ge=2,
        le=1000,
        description="Audio frames (80 ms) queued per session towards a slow client; beyond it further frames are "
        "dropped (counted).",
    )
    slow_client_timeout_s: float = Field(
        10.0, gt=0, description="A client that accepts no message for this long while output waits is closed."
    )
    engine_command_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest wait for the engine thread to attach or reset a session's slot; beyond it the "
        "session fails (1011) and its slot is released.",
    )
    engine_stall_s: float = Field(
        30.0,
        gt=0,
        description="A model step or engine command that has not returned for this long means the engine thread "
        "hangs: the server turns failed (/health and /ready 503, so liveness restarts it), new sessions are "
        "refused and live ones end with 1011.",
    )
    max_message_bytes: int = Field(
        1 << 20, ge=1024, description="Largest websocket message accepted from a client."
    )
    gc_interval_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="A full Python garbage collection this often (about a millisecond: model objects are frozen), "
        "so that cycles left by closed connections, and the client messages they hold, are freed within seconds "
        "instead of minutes; 0 leaves it to CPython's counters.",
    )
    switch_interval_ms: float = Field(
        0.0,
        ge=0,
        le=100,
        description="Python's GIL switch interval (sys.setswitchinterval) set at start, in ms; 0 keeps Python's "
        "5 ms. torch releases the GIL around each op, and while the event loop holds it the engine thread may "
        "wait up to this long per op to get it back; with the server's own codec thread no gain was measured.",
    )
    malloc_arena_max: int = Field(
        2,
        ge=0,
        le=64,
        description="glibc malloc arenas (mallopt M_ARENA_MAX) set at start: few arenas keep memory freed by "
        "large client messages from fragmenting across threads; 0 keeps glibc's default (8 x cores); "
        "$MALLOC_ARENA_MAX wins.",
    )
    malloc_mmap_threshold_bytes: int = Field(
        128 * 1024,
        ge=0,
        le=32 << 20,
        description="Blocks at least this large are mmapped and returned to the kernel on free (mallopt "
        "M_MMAP_THRESHOLD; a fixed value turns off glibc's dynamic threshold, under which big messages "
        "fragment the heap); 0 keeps glibc's default; $MALLOC_MMAP_THRESHOLD_ wins.",
    )
    input_buffer_s: float = Field(
        10.0,
        ge=0,
        le=60,
        description="/v1/realtime and /v1/live/sessions: audio a client may send ahead of real time; it is queued and fed at real "
        "time, audio beyond it is dropped (counted).",
    )
    live_usage_interval_s: float = Field(
        5.0, ge=0, le=3600, description="/v1/live/sessions: how often session.usage.updated is sent (0: never, only "
        "in session.closed)."
    )
    input_burst_s: float = Field(
        2.0, ge=0.1, le=10, description="Audio that passes at once when it arrives early (network jitter) before pacing applies."
    )
    flood_close_s: float = Field(
        10.0,
        gt=0,
        description="A session that had this much audio dropped for arriving too far ahead of real time is closed (1008).",
    )
    webrtc_connect_timeout_s: float = Field(
        30.0, gt=0, le=600,
        description="/v1/realtime/calls: a call whose ICE and DTLS have not connected this long after the answer is "
        "ended (reason ice_timeout) and its session slot freed.",
    )
    webrtc_consent_timeout_s: float = Field(
        30.0, ge=3, le=300,
        description="A connected WebRTC call whose peer stops answering ICE consent checks (RFC 7675: 30 s) is "
        "ended this long after its last answer (reason client_closed): a vanished phone or closed laptop frees "
        "its slot. Checks go every sixth of it.",
    )
    webrtc_ice_servers: list[str | WebRtcIceServer] = Field(
        default_factory=list,
        description="STUN/TURN servers the server's WebRTC peer gathers candidates with: URLs (stun:...) or "
        "{urls, username, credential} for TURN (empty: host candidates only, enough on a LAN or with a public "
        "address). docs/server.md, \"WebRTC in real networks\".",
    )
    webrtc_ice_transport_policy: Literal["all", "relay"] = Field(
        "all",
        description="relay: offer only TURN relay candidates (media always through the TURN server, the only UDP "
        "a firewall must open towards kame's clients).",
    )
    webrtc_public_address: str | None = Field(
        None,
        description="1:1 NAT (a cloud VM's public IP, Docker/Kubernetes hostNetwork behind one): the answer also "
        "offers each host candidate's port at this IP address.",
    )
    webrtc_input_delay_s: float = Field(
        0.06, ge=0, le=1.0,
        description="WebRTC input: playout delay that absorbs network jitter before a packet counts as late "
        "(concealed) on the server's 80 ms clock.",
    )
    record_dir: Path | None = Field(
        None,
        description="Write each session's audio (user.wav, assistant.wav) and events.jsonl (transcripts) "
        "under this directory (None: record nothing).",
    )
    ssl_certfile: Path | None = Field(None, description="TLS certificate (PEM); together with ssl_keyfile the server speaks https/wss.")
    ssl_keyfile: Path | None = Field(None, description="TLS private key (PEM).")
    client_dir: Path | None = Field(
        None,
        description="A built web client to serve at / instead of kame's page (kame serve --client-dir; "
        "like moshi.server --static): e.g. the dist/ folder of Kyutai's Moshi web client, which then "
        "talks to this server without ?worker_addr. kame's page then moves to /kame.",
    )

    @field_validator("webrtc_public_address")
    @classmethod
    def _public_address(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                ipaddress.ip_address(v)
            except ValueError:
                raise ValueError(f"webrtc_public_address must be an IP address, not {v[:64]!r}") from None
        return v


class LogConfig(BaseModel):
    """Logging. Transcript text is only logged at ``debug``."""

    model_config = ConfigDict(extra="forbid")

    level: str = Field("info", description="debug, info, warning or error.")
    json_format: bool = Field(False, description="One JSON object per log line.")


class TwilioConfig(BaseModel):
    """Phone calls from Twilio (or Telnyx) Media Streams: ``POST /twilio/voice`` and the ``/twilio/media``
    websocket (docs/telephony.md)."""

    model_config = ConfigDict(extra="forbid")

    auth_token: SecretStr | None = Field(
        None,
        description="The Twilio account's auth token (env KAME_TWILIO__AUTH_TOKEN; a secret: never logged): when set, "
        "X-Twilio-Signature is checked on /twilio/voice and on the /twilio/media upgrade (403 when wrong), and "
        "it stands in for server.auth_token there (Twilio cannot send a bearer token).",
    )
    public_url: str | None = Field(
        None,
        description="The server's public base URL as Twilio reaches it (e.g. https://voice.example.com): the "
        "Stream URL of the TwiML and the URL signatures are checked against. Default: from the request's "
        "X-Forwarded-Proto / X-Forwarded-Host or Host headers.",
    )
    start_timeout_s: float = Field(
        10.0, gt=0, le=120,
        description="A /twilio/media socket that sends no `start` message within this is closed (1008) and logged.",
    )

    @field_validator("auth_token")
    @classmethod
    def _empty_token(cls, v: SecretStr | None) -> SecretStr | None:
        return v if v is not None and v.get_secret_value() else None  # "" (an empty Secret key): no token

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"twilio.public_url must start with https:// (or http://), not {v[:64]!r}")
        return v


class AppConfig(KameConfig):
    """Every setting of kame (the core's, kame.config.KameConfig, and the server's)."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    twilio: TwilioConfig = Field(default_factory=TwilioConfig)
    sip: SipConfig = Field(default_factory=SipConfig)

    @classmethod
    def normalize_layer(cls, tree: dict[str, Any], where: str) -> dict[str, Any]:
        return moved_max_sessions(tree, where)

    @model_validator(mode="before")
    @classmethod
    def _sessions_setting(cls, data: Any) -> Any:
        return moved_max_sessions(data, "config") if isinstance(data, dict) else data


def load_app_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AppConfig:
    """:func:`kame.config.load_config` for the whole config (file < environment < flags)."""
    return load_config(path, environ=environ, overrides=overrides, model=AppConfig)


def moved_max_sessions(tree: dict[str, Any], where: str) -> dict[str, Any]:
    """``server.max_sessions`` is deprecated: it set the same number as ``frontend.batch_size`` (the
    engine's slots, which are the concurrent sessions). Moved there with a warning, within one layer
    (so precedence holds); both in one layer with different values is an error."""
    server = tree.get("server")
    if not isinstance(server, dict) or server.get("max_sessions") is None:
        return tree
    server = {k: v for k, v in server.items() if k != "max_sessions"}
    sessions = tree["server"]["max_sessions"]
    frontend = tree.get("frontend")
    frontend = dict(frontend) if isinstance(frontend, dict) else {}
    if frontend.get("batch_size", sessions) != sessions:
        raise ValueError(f"{where}: server.max_sessions ({sessions}) and frontend.batch_size "
                         f"({frontend['batch_size']}) disagree; server.max_sessions is deprecated, set only frontend.batch_size")
    log.warning("%s: server.max_sessions is deprecated, use frontend.batch_size (the same number: "
                "concurrent sessions = engine slots)", where)
    frontend["batch_size"] = sessions
    return {**tree, "server": server, "frontend": frontend}
