#!/usr/bin/env bash
# The README's test command: install everything (venv, Python and Debian
# packages) from scratch if needed, check style and types (scripts/lint.sh: ruff, mypy),
# then run the whole test suite (TEST_WORKERS pytest-xdist workers, 4 by default, 0 for one process; the 15
# slowest tests listed).
# Extra arguments go to pytest.
#
# Each step is a `phase NAME COMMAND...`: timed, reported, and listed in the final summary line
# ("test.sh: install 116 s, lint 17 s, tests 825 s, total 958 s (exit 0)"). A new step is one more
# `phase` line; a failing phase stops the run with its message.
set -uo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
summary=()
rc=0

finish() {
    echo "test.sh: $(IFS=,; echo "${summary[*]}" | sed 's/,/, /g'), total $(( $(date +%s) - t_start )) s (exit $rc)"
    exit $rc
}

# phase NAME "failure message" COMMAND...: run COMMAND, record NAME's seconds; on failure print the
# message and stop (the summary line still lists every phase run so far).
phase() {
    local name=$1 failure=$2 t0
    shift 2
    t0=$(date +%s)
    "$@"
    local status=$?
    summary+=("$name $(( $(date +%s) - t0 )) s")
    echo "test.sh: phase $name: $(( $(date +%s) - t0 )) s (exit $status)"
    if [ $status -ne 0 ]; then
        rc=$status
        [ -n "$failure" ] && echo "test.sh: $failure" >&2
        finish
    fi
}

export NO_TORCH_COMPILE=1
export PYTEST_KAME_ARTIFACTS=${PYTEST_KAME_ARTIFACTS:-$PWD/artifacts}

phase install "installation failed" ./scripts/install.sh --test
phase lint "ruff or mypy failed (scripts/lint.sh)" ./scripts/lint.sh
# The tests: in TEST_WORKERS pytest-xdist workers (4 by default; 0: one process, the default when arguments
# select tests: four workers would each collect the whole suite first). Under xdist the tests that
# share a server run on one worker, so that it starts once (tests/support/scheduling.py), the others a file
# at a time, in two lanes: the real-time units (servers, the wall clock) on the first two workers
# (PYTEST_KAME_REALTIME_WORKERS), the batch units on the others, niced; the tests marked `alone` (timing
# under a load they make themselves) run last, on one worker, once every other worker has finished
# (tests/support/xdist_alone.py). On the 2-core machine four workers take 340-360 s, one process about
# 900 s (docs/development.md).
run_tests() {
    local workers=${TEST_WORKERS:-4}
    [ $# -gt 0 ] && workers=${TEST_WORKERS:-0}
    # One thread per numeric library (tests/conftest.py says why): set before the interpreter starts.
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    if [ "$workers" = "0" ]; then
        .venv/bin/python -m pytest -ra --durations=15 "$@"
    else
        .venv/bin/python -m pytest -ra --durations=15 -n "$workers" "$@"
    fi
}

phase tests "" run_tests "$@"
phase eval "the evaluation phase failed (scripts/test_eval.sh)" ./scripts/test_eval.sh
phase calls "the calls phase failed (scripts/test_calls.sh)" ./scripts/test_calls.sh
phase gpu-paths "the GPU-only paths run on CPU failed (scripts/test_gpu_paths.sh)" ./scripts/test_gpu_paths.sh
phase frameworks "the framework tests failed (scripts/test_frameworks.sh)" ./scripts/test_frameworks.sh
phase image "the image phase failed (scripts/test_image.sh)" ./scripts/test_image.sh
finish
