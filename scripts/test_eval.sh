#!/usr/bin/env bash
# The evaluation harness end to end (tests/eval_e2e): `kame eval` (MT-Bench) and `kame eval duplex` against
# real CPU-demo servers, their generated sets, judges on loopback and the benchmark's file layout. Their own
# timed phase: each runs whole evaluations at real time, minutes of wall time that the main tests phase's
# budget cannot hold. Two pytest-xdist workers (the tests sharing a server on one of them, as in the main
# run). Needs .venv (scripts/install.sh --test). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# pyproject's addopts leave tests/eval_e2e out of the main run; this run is only them
.venv/bin/python -m pytest -o addopts="-p pytester" -ra --durations=10 -n "${EVAL_WORKERS:-2}" tests/eval_e2e "$@"
rc=$?
echo "test_eval.sh: tests $(( $(date +%s) - t0 )) s (exit $rc)"
exit $rc
