#!/usr/bin/env bash
# The calls phase (tests/calls): phones over SIP and Twilio's media streams, calls past the model's context,
# resumed calls and rollouts, with real parts on loopback (a SIP phone no one here wrote, SIPp, Redis,
# HAProxy). Their own timed phase: each holds a real server for tens of seconds, more than the main tests
# phase's budget can hold; two workers (CALLS_WORKERS), both in the real-time lane. Needs .venv (scripts/install.sh --test). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# pyproject's addopts leave tests/calls out of the main run; this run is only them
.venv/bin/python -m pytest -o addopts="-p pytester" -ra --durations=10 -n "${CALLS_WORKERS:-2}" tests/calls "$@"
rc=$?
echo "test_calls.sh: tests $(( $(date +%s) - t0 )) s (exit $rc)"
exit $rc
