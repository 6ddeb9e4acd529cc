"""The server peer's ICE set-up from the config: STUN/TURN servers, the relay-only policy, and a public
address for 1:1 NAT, and how long a silent peer keeps its consent. aiortc's configuration objects in,
SDP text out, no I/O.

aioice (0.13) binds each host candidate to an ephemeral UDP port and has no option for a port range or
for announcing a NAT's public address. The public address is added here to the answer (each host
candidate's port at that address, typed ``srflx`` as a STUN server would report it); a fixed port range
is not offered: behind a firewall that opens only a few ports, relay through TURN
(``webrtc_ice_transport_policy: relay``) so that only the TURN server's ports need to be open
(docs/server.md, "WebRTC in real networks").

Consent (RFC 7675): aioice checks a connected peer every ``CONSENT_INTERVAL`` seconds (5) and closes the
connection after ``CONSENT_FAILURES`` (6) unanswered checks. Neither is a connection option: they are
aioice module constants, which :func:`rtc_configuration` sets from ``webrtc_consent_timeout_s`` (one
server, one configuration, so a process-wide value is the configured one).
"""

from __future__ import annotations

from typing import Any

from kame.server.config import ServerConfig


def set_consent_timeout(seconds: float) -> None:
    """Connected peers lose consent ``seconds`` after their last answered check (checks every sixth of it)."""
    # deferred: aioice loads with the first WebRTC call (a server without calls never imports it)
    import aioice.ice

    aioice.ice.CONSENT_INTERVAL = seconds / aioice.ice.CONSENT_FAILURES  # type: ignore[assignment]  # an int there, a float is fine (asyncio.sleep)


def rtc_configuration(cfg: ServerConfig) -> Any:
    """aiortc's ``RTCConfiguration`` for ``cfg``'s ICE servers and transport policy (and the consent timeout
    set, see the module docstring)."""
    # deferred: aiortc loads with the first WebRTC call (a server without calls never imports it)
    from aiortc import RTCConfiguration, RTCIceServer
    from aiortc.rtcconfiguration import RTCIceTransportPolicy

    set_consent_timeout(cfg.webrtc_consent_timeout_s)
    servers = []
    for entry in cfg.webrtc_ice_servers:
        if isinstance(entry, str):
            servers.append(RTCIceServer(urls=entry))
            continue
        secret = entry.credential.get_secret_value() if entry.credential is not None else None
        servers.append(RTCIceServer(urls=entry.url_list(), username=entry.username, credential=secret))
    policy = RTCIceTransportPolicy.RELAY if cfg.webrtc_ice_transport_policy == "relay" else RTCIceTransportPolicy.ALL
    return RTCConfiguration(iceServers=servers or None, iceTransportPolicy=policy)


def with_public_address(sdp: str, address: str) -> str:
    """``sdp`` with, after each UDP host candidate, the same port at ``address`` (a server-reflexive
    candidate, slightly less preferred than the host one, so a peer on the LAN still goes direct)."""
    out: list[str] = []
    family_v6 = ":" in address
    for line in sdp.splitlines():
        out.append(line)
        if not line.startswith("a=candidate:"):
            continue
        parts = line[len("a=candidate:"):].split()
        # foundation component transport priority address port "typ" type [extensions]
        if len(parts) < 8 or parts[2].lower() != "udp" or parts[6] != "typ" or parts[7] != "host":
            continue
        host, port = parts[4], parts[5]
        if host == address or (":" in host) != family_v6:
            continue
        try:
            priority = max(1, int(parts[3]) - (26 << 24))  # type preference 126 (host) -> 100 (srflx)
        except ValueError:
            continue
        out.append(f"a=candidate:{parts[0]}n {parts[1]} udp {priority} {address} {port} typ srflx raddr {host} rport {port}")
    return "\r\n".join(out) + "\r\n"

