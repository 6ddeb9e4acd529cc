#!/usr/bin/env bash
# The README's start command: install kame into .venv/ if needed, then run
# `kame serve` (arguments are passed on, e.g. `--config cpu-demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
exec .venv/bin/kame serve "$@"
