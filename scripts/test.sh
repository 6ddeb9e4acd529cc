#!/usr/bin/env bash
# The README's test command: install everything (venv, Python and Debian
# packages) from scratch if needed, check style and types (scripts/lint.sh: ruff, mypy),
# then run the whole test suite.
# Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
./scripts/install.sh --test || { echo "test.sh: installation failed" >&2; exit 1; }
t1=$(date +%s)
./scripts/lint.sh || { echo "test.sh: ruff or mypy failed (scripts/lint.sh)" >&2; exit 1; }
t2=$(date +%s)
export NO_TORCH_COMPILE=1
export PYTEST_KAME_ARTIFACTS=${PYTEST_KAME_ARTIFACTS:-$PWD/artifacts}
.venv/bin/python -m pytest -ra "$@"
rc=$?
./scripts/test_frameworks.sh || rc=1  # its own timed phase: the frameworks in their virtualenvs
t3=$(date +%s)
echo "test.sh: install $((t1 - t0)) s, lint $((t2 - t1)) s, tests $((t3 - t2)) s, total $((t3 - t0)) s (exit $rc)"
exit $rc
