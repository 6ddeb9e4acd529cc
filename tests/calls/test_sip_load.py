"""8 phones at once over SIP (SIPp, Debian's ``sip-tester``, playing G.711 RTP) against the CPU demo with
ASR off and no webhook: every call is answered with ``sip.default_session`` (pointing a trunk at kame is
enough to talk) and runs at real time. The lateness figure itself is bench/sip_load.py's (docs/benchmarks.md);
here only a bound that holds on a loaded 2-core machine."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.moshi_client import ServerProcess
from tests.support.sip import Phone, free_rtp_range, free_sip_port

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sip_load  # noqa: E402

CALLS = 8


@pytest.fixture(scope="module")
def load_server(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    port, rtp = free_sip_port(2), free_rtp_range(48)
    env = {"KAME_SIP__PORT": str(port), "KAME_SIP__RTP_PORT_MIN": str(rtp), "KAME_SIP__RTP_PORT_MAX": str(rtp + 47),
           "KAME_ASR__KIND": "none", "KAME_SERVER__DRAIN_GRACE_S": "1"}
    srv = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp_path_factory.mktemp("sip-load") / "server.log", env=env,
                        label="cpu-demo + sip, asr none")
    srv.sip_port = port  # type: ignore[attr-defined]
    yield srv.start()
    srv.stop()


def test_eight_sipp_calls_at_once_are_answered_at_real_time(load_server: ServerProcess) -> None:
    result = sip_load.measure(load_server, load_server.sip_port, CALLS, 8.0, free_rtp_range(32))  # type: ignore[attr-defined]
    assert result["sipp_rc"] == 0, result
    assert result["sessions"] == CALLS, result
    assert result["rtf_min"] >= 0.95, result
    assert result["lateness_p99_s_bucket"] <= 0.25, result
    logs = load_server.logs()
    assert logs.count("peer=sip") == CALLS and "no webhook: calls are answered with sip.default_session" in logs
    assert load_server.metric("kame_sip_calls_total", 'result="answered"') == CALLS


def test_a_draining_server_refuses_new_calls_and_hangs_up_its_own(load_server: ServerProcess) -> None:
    """Last in this module: it stops the server. SIGTERM drains: a new INVITE gets 503, the live call is
    told goodbye (BYE) once ``server.drain_grace_s`` passed, and the server exits."""
    uri = f"sip:kame@127.0.0.1:{load_server.sip_port}"  # type: ignore[attr-defined]
    phone = Phone(uri=uri, max_s=60)
    phone.wait_for(lambda e: e["event"] == "state" and e["state"] == "CONFIRMED", 20)
    load_server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    late = Phone(uri=uri, max_s=10).finish(20)
    t0 = time.monotonic()
    events = phone.finish(40)
    assert time.monotonic() - t0 < 20, events  # hung up by kame, long before the phone's own 60 s
    assert ("DISCONNECTED", 503) in Phone.states_of(late), late
    assert "DISCONNECTED" in [s for s, _ in Phone.states_of(events)]
    load_server.proc.wait(30)
    assert "reason=draining" in load_server.logs() or "reason=drain" in load_server.logs()
