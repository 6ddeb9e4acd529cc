"""The two readiness verdicts: load balancer (/ready) and Kubernetes (/ready?full_ok=1)."""

from __future__ import annotations

from kame.server.app.readiness import flag, readiness


def verdict(**kw: object) -> tuple[bool, str]:
    args = {"draining": False, "host_state": "ok", "host_ready": True, "free_slots": 2, "full_ok": False}
    args.update(kw)
    r = readiness(**args)  # type: ignore[arg-type]
    return r.ok, r.reason


def test_a_full_replica_is_unready_for_load_balancers_but_ready_for_kubernetes() -> None:
    assert verdict(free_slots=0) == (False, "full")
    assert verdict(free_slots=0, full_ok=True) == (True, "")
    assert readiness(draining=False, host_state="ok", host_ready=True, free_slots=3, full_ok=False).free == 3


def test_draining_and_starting_are_unready_both_ways() -> None:
    for full_ok in (False, True):
        assert verdict(draining=True, full_ok=full_ok) == (False, "draining")
        assert verdict(draining=True, host_ready=False, host_state="starting", full_ok=full_ok) == (False, "draining")
        assert verdict(host_ready=False, host_state="starting", full_ok=full_ok) == (False, "starting")
        assert verdict(host_ready=False, host_state="failed", full_ok=full_ok) == (False, "failed")


def test_query_flag() -> None:
    assert flag("1") and flag("true") and flag(" Yes ")
    assert not flag(None) and not flag("0") and not flag("") and not flag("no")
