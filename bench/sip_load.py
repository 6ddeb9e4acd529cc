"""Phones at once over SIP: SIPp (Debian's ``sip-tester``) places N calls together, each playing G.711
RTP (SIPp's own ``g711a.pcap``: 7 s of A-law speech, PCMA) for ``--seconds``, against ``kame serve`` with
SIP on and no webhook (every call answered with ``sip.default_session``).

It prints one JSON object: SIPp's successful and failed calls, the sessions the server ran (``peer=sip``),
each call's real-time factor (output frames x 80 ms / its duration), and the server's frame lateness
(``kame_frame_lateness_seconds``: how late each output frame left against its 80 ms schedule) as a p99
read off the histogram's buckets (an upper bound). ``--asr none`` (the default) leaves Whisper out, as
the websocket load figures in docs/benchmarks.md do.

    .venv/bin/python bench/sip_load.py --calls 8 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

PCAP = Path("/usr/share/sip-tester/g711a.pcap")
#: Calls one of kame's PJSIP processes takes (server/telephony/stack.py's CALLS_PER_PROCESS).
CALLS_PER_PROCESS = 4

SCENARIO = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="kame phones">
  <send retrans="500">
    <![CDATA[
      INVITE sip:kame@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
      To: <sip:kame@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

      v=0
      o=sipp 53655765 2353687637 IN IP[local_ip_type] [local_ip]
      s=-
      c=IN IP[media_ip_type] [media_ip]
      t=0 0
      m=audio [media_port] RTP/AVP 8 101
      a=rtpmap:8 PCMA/8000
      a=rtpmap:101 telephone-event/8000
      a=fmtp:101 0-15
    ]]>
  </send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="200" rtd="true"/>
  <send>
    <![CDATA[
      ACK sip:kame@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      CSeq: 1 ACK
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <nop><action><exec play_pcap_audio="PCAP"/></action></nop>
  <pause milliseconds="CALL_MS"/>
  <send retrans="500">
    <![CDATA[
      BYE sip:kame@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      CSeq: 2 BYE
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <recv response="200" crlf="true"/>
</scenario>
"""

_ENDED = re.compile(r"session ended .*seconds=([0-9.]+) frames_in=(\d+) frames_out=(\d+)")


def lateness_p99(metrics_text: str, before: dict[float, float] | None = None) -> tuple[float, dict[float, float]]:
    """(the p99 bucket bound of ``kame_frame_lateness_seconds`` since ``before``, the cumulative buckets now)."""
    buckets: dict[float, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("kame_frame_lateness_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-1])
    since = {le: n - (before or {}).get(le, 0.0) for le, n in buckets.items()}
    total = since.get(float("inf"), 0.0)
    if total <= 0:
        return float("nan"), buckets
    for le in sorted(since):
        if since[le] >= 0.99 * total:
            return le, buckets
    return float("inf"), buckets


def run_sipp(sip_port: int, calls: int, seconds: float, workdir: Path, media_port: int) -> list[int]:
    """SIPp's exit codes: one SIPp per PJSIP process of kame (4 calls each, on sip_port, sip_port + 1, ...)."""
    scenario = workdir / "phones.xml"
    scenario.write_text(SCENARIO.replace("PCAP", str(PCAP)).replace("CALL_MS", str(int(seconds * 1000))))
    procs = []
    for k in range(-(-calls // CALLS_PER_PROCESS)):
        n = min(CALLS_PER_PROCESS, calls - k * CALLS_PER_PROCESS)
        cmd = ["sipp", "-sf", str(scenario), f"127.0.0.1:{sip_port + k}", "-i", "127.0.0.1", "-p", "0",
               "-mp", str(media_port + 4 * k), "-m", str(n), "-l", str(n), "-r", str(n), "-rp", "1000", "-nostdin",
               "-trace_err", "-error_file", str(workdir / f"sipp_errors_{k}.log"), "-timeout", f"{int(seconds + 60)}s"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir))
    return [p.wait(seconds + 90) for p in procs]


def measure(server: Any, sip_port: int, calls: int, seconds: float, media_port: int) -> dict[str, Any]:
    """SIPp's ``calls`` at once against a running ``server`` (tests/support/moshi_client.ServerProcess)."""
    _, before_text = server.get("/metrics")
    _, before = lateness_p99(before_text)
    ended_before = len(_ENDED.findall(server.logs()))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        done = run_sipp(sip_port, calls, seconds, Path(tmp), media_port)
        wall = time.monotonic() - t0
        errors = "".join(p.read_text(errors="replace")[-1000:] for p in Path(tmp).glob("sipp_errors_*.log"))
    deadline = time.monotonic() + 10
    while len(_ENDED.findall(server.logs())) < ended_before + calls and time.monotonic() < deadline:
        time.sleep(0.2)
    ended = _ENDED.findall(server.logs())[ended_before:]
    _, after_text = server.get("/metrics")
    p99, _ = lateness_p99(after_text, before)
    rtf = [int(out) * 0.08 / float(secs) for secs, _in, out in ended if float(secs) > 0]
    return {"calls": calls, "seconds": seconds, "sipp_rc": max(done), "sipp_errors": errors[-500:],
            "sessions": len(ended), "rtf_min": round(min(rtf), 3) if rtf else None,
            "frames_in_per_s_min": round(min(int(i) / float(s) for s, i, _o in ended), 2) if ended else None,
            "lateness_p99_s_bucket": p99, "wall_s": round(wall, 1)}


def main() -> None:
    from tests.support.moshi_client import ServerProcess
    from tests.support.sip import free_rtp_range, free_sip_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--asr", default="none")
    parser.add_argument("--log", type=Path, help="keep the server's log here")
    args = parser.parse_args()
    sip_port, rtp = free_sip_port(-(-args.calls // CALLS_PER_PROCESS)), free_rtp_range(4 * args.calls + 8)
    media = free_rtp_range(4 * args.calls)
    with tempfile.TemporaryDirectory() as tmp:
        env = {"KAME_SIP__PORT": str(sip_port), "KAME_SIP__RTP_PORT_MIN": str(rtp),
               "KAME_SIP__RTP_PORT_MAX": str(rtp + 4 * args.calls + 7), "KAME_ASR__KIND": args.asr}
        server = ServerProcess(cache_dir=Path(tmp) / "cache", log_path=args.log or Path(tmp) / "server.log", env=env,
                               label="cpu-demo + sip").start()
        try:
            print(json.dumps(measure(server, sip_port, args.calls, args.seconds, media)))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
