#!/usr/bin/env bash
# The voice-agent frameworks against kame (tests/frameworks): OpenAI's Agents SDK, LiveKit Agents and
# Pipecat, each in its own virtualenv outside the checkout (their pins clash with kame's), built on
# first use under $KAME_VENVS (default ~/.cache/kame-venvs) keyed by their pins and reused after.
# Needs .venv (scripts/install.sh --test). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
nice -n 5 .venv/bin/python tests/frameworks/venvs.py || { echo "test_frameworks.sh: building the frameworks' virtualenvs failed" >&2; exit 1; }
t1=$(date +%s)
export NO_TORCH_COMPILE=1
# pyproject's addopts leave tests/frameworks out of the main run; this run is only them
.venv/bin/python -m pytest -o addopts="" -ra tests/frameworks "$@"
rc=$?
t2=$(date +%s)
echo "test_frameworks.sh: virtualenvs $((t1 - t0)) s, tests $((t2 - t1)) s (exit $rc)"
exit $rc
