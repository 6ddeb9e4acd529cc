"""``kame mic``: microphone to server to speakers, or wav in / wav out, with a live transcript."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

NAME = "mic"
HELP = "Talk to a kame server from the terminal (microphone and speakers, echo cancelled; or --input-wav/--output-wav)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kame.session.settings import ORACLE_POLICIES

    p.add_argument("--server", default="http://127.0.0.1:8998", help="Server base URL, http(s)://host:port.")
    p.add_argument("--protocol", choices=["realtime", "moshi"], default="realtime",
                   help="realtime (/v1/realtime: transcripts and oracle shown) or moshi (/api/chat).")
    p.add_argument("--backend", default=None, help="LLM back-end by name (see GET /v1/backends).")
    p.add_argument("--oracle-policy", default=None, choices=list(ORACLE_POLICIES))
    p.add_argument("--instructions", default=None, help="Per-session instructions for the LLM (realtime only).")
    p.add_argument("--voice", default=None,
                   help="The voice of a PersonaPlex checkpoint (GET /health lists them): realtime "
                        "audio.output.voice, moshi ?voice_prompt=NAME.pt.")
    p.add_argument("--token", default=None, help="Bearer token (default: $KAME_AUTH_TOKEN).")
    p.add_argument("--input-wav", type=Path, default=None, help="Send this file at real time instead of the microphone.")
    p.add_argument("--output-wav", type=Path, default=None, help="Write everything the server sent here.")
    p.add_argument("--tail", type=float, default=4.0, help="Seconds the line stays open after --input-wav ends.")
    p.add_argument("--no-aec", dest="aec", action="store_false",
                   help="Do not cancel the echo of the reply in the microphone (WebRTC AEC3, on by default: speakers are fine). "
                        "Without it, use headphones: the assistant would hear itself and answer itself.")
    p.add_argument("--echo-path", type=Path, default=None, metavar="IR.wav",
                   help="With --input-wav: simulate a speaker and microphone, mixing the reply convolved with this room "
                        "impulse response (its leading silence is the delay) into the file's audio.")
    p.add_argument("--record-wav", type=Path, default=None,
                   help="With --echo-path: write a 2-channel wav, what the simulated microphone heard (left) and what was sent (right).")
    p.add_argument("--retries", type=int, default=8,
                   help="Reconnect this many times in a row after a refusal (1013, HTTP 503) or a drain (1001), "
                        "with back-off and jitter; each reconnect starts a new conversation. 0: never.")


def run(args: argparse.Namespace) -> int:
    from kame.client.mic import MicOptions, run_mic
    from kame.client.reconnect import Backoff
    from kame.errors import UserError

    if args.retries < 0:
        raise UserError("--retries: 0 or more")

    opts = MicOptions(
        server=args.server,
        protocol=args.protocol,
        backend=args.backend,
        token=args.token or os.environ.get("KAME_AUTH_TOKEN") or None,
        input_wav=args.input_wav,
        output_wav=args.output_wav,
        tail_s=args.tail,
        instructions=args.instructions,
        oracle_policy=args.oracle_policy,
        voice=args.voice,
        backoff=Backoff(attempts=args.retries),
        aec=args.aec,
        echo_path=args.echo_path,
        record_wav=args.record_wav,
    )
    return run_mic(opts)
