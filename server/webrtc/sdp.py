"""Checks of an SDP offer before aiortc sees it, each refusal one sentence for the client. No I/O."""

from __future__ import annotations

#: Largest offer accepted (a browser's is 3 to 8 kB).
MAX_SDP_BYTES = 64 * 1024
#: Audio codecs aiortc answers with (Opus first, then G.711).
AUDIO_CODECS = ("opus", "pcmu", "pcma")


class OfferError(ValueError):
    """An offer kame cannot answer (the message is the client's one-sentence reason)."""


def check_offer(sdp: str) -> None:
    """Raise :class:`OfferError` unless ``sdp`` looks like an SDP offer with audio kame can decode."""
    if not sdp or not sdp.strip():
        raise OfferError("The request has no SDP offer.")
    if len(sdp.encode("utf-8", "replace")) > MAX_SDP_BYTES:
        raise OfferError(f"The SDP offer is larger than {MAX_SDP_BYTES // 1024} kB.")
    lines = [line.strip() for line in sdp.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0] != "v=0":
        raise OfferError("The body is not an SDP offer (it must start with \"v=0\").")
    audio = False
    codecs: set[str] = set()
    in_audio = False
    for line in lines:
        if line.startswith("m="):
            in_audio = line.startswith("m=audio ")
            if in_audio and not line.startswith("m=audio 0 "):
                audio = True
        elif in_audio and line.startswith("a=rtpmap:"):
            _, _, rest = line.partition(" ")
            codecs.add(rest.split("/")[0].lower())
    if not audio:
        raise OfferError("The SDP offer has no audio media section; add an audio track or transceiver.")
    if not codecs & set(AUDIO_CODECS):
        raise OfferError("The SDP offer's audio has no codec kame speaks (Opus, PCMU or PCMA).")
