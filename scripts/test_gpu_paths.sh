#!/usr/bin/env bash
# The paths only a GPU box takes, run on CPU (tests/gpu_paths): torch.compile through a real session, the
# model of the released width at reduced depth. Their own timed phase: each costs tens of seconds once
# (inductor's C++ build, a 0.8 B-parameter checkpoint), which the main tests phase's budget cannot hold.
# Needs .venv (scripts/install.sh --test). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# pyproject's addopts leave tests/gpu_paths out of the main run; this run is only them
.venv/bin/python -m pytest -o addopts="-p pytester" -ra --durations=10 tests/gpu_paths "$@"
rc=$?
echo "test_gpu_paths.sh: tests $(( $(date +%s) - t0 )) s (exit $rc)"
exit $rc
