"""The ``sip`` section: phones over SIP (off until ``port`` is set, e.g. ``KAME_SIP__PORT=5070``)."""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

IncomingEvent = Literal["realtime.call.incoming", "live.transport.incoming"]


class SipConfig(BaseModel):
    """SIP trunks calling kame as they call OpenAI (docs/sip.md). PJSIP runs in a child process of ``kame serve``."""

    model_config = ConfigDict(extra="forbid")

    port: int | None = Field(None, ge=1, le=65535, description="SIP port (UDP and TCP); unset: no SIP.")
    processes: int | None = Field(
        None, ge=1, le=64,
        description="PJSIP child processes, on ports port, port+1, ... with 4 calls each (the pjsua2 wheels' limit); "
                    "unset: enough for frontend.batch_size. A trunk or SIP proxy spreads calls over them (docs/sip.md).")
    host: str = Field("127.0.0.1", description="Address SIP and RTP listen on (0.0.0.0: every interface).")
    transports: list[Literal["udp", "tcp"]] = Field(
        ["udp", "tcp"], min_length=1,
        description="SIP transports on ``port``. TLS is terminated in front (docs/sip.md), never by the child's OpenSSL.")
    public_address: str | None = Field(
        None, description="Address advertised in SIP Contact/Via and SDP when behind NAT (the host's public IP or name).")
    rtp_port_min: int = Field(40000, ge=1024, le=65535, description="First UDP port of the RTP range.")
    rtp_port_max: int = Field(40999, ge=1024, le=65535, description="Last UDP port of the RTP range (two per call).")
    codecs: list[str] = Field(["PCMU", "PCMA", "G722"], min_length=1,
                              description="Audio codecs, preferred first (PCMU, PCMA, G722, speex, iLBC, GSM).")
    webhook_url: str | None = Field(
        None, description="Where incoming calls are announced (OpenAI's signed webhook); unset: answer with default_session.")
    webhook_secret: SecretStr | None = Field(
        None, description="whsec_<base64> secret signing the webhook (Standard Webhooks; a secret: never logged).")
    webhook_events: list[IncomingEvent] = Field(
        ["realtime.call.incoming", "live.transport.incoming"], min_length=1,
        description="Events posted per call; the first accept (Realtime or Live) takes the call.")
    accept_timeout_s: float = Field(
        10.0, gt=0, le=120, description="A call not accepted within this is refused with SIP 480; webhooks retry until then.")
    allowed_networks: list[str] = Field(
        [], description="CIDRs an INVITE may come from (a trunk's ranges); empty: any. Others get SIP 403.")
    default_session: dict[str, Any] = Field(
        {"type": "realtime"}, description="The accept body used when there is no webhook_url (a Realtime session config).")
    input_delay_s: float = Field(0.06, ge=0, le=0.5, description="Playout delay of caller audio on the server's clock.")

    @field_validator("allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for net in value:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"sip.allowed_networks: {net!r} is not a network (CIDR)") from None
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        from kame.server.telephony.webhook import WebhookSecretError, secret_key

        if value is not None:
            try:
                secret_key(value.get_secret_value())
            except WebhookSecretError as exc:
                raise ValueError(f"sip.webhook_secret: {exc}") from None
        return value

    @model_validator(mode="after")
    def _range(self) -> SipConfig:
        if self.rtp_port_max < self.rtp_port_min + 1:
            raise ValueError("sip.rtp_port_max must be above sip.rtp_port_min (two ports per call)")
        if self.default_session.get("type", "realtime") not in ("realtime", "live"):
            raise ValueError('sip.default_session.type must be "realtime" or "live"')
        return self
