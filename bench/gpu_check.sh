#!/usr/bin/env bash
# The GPU checks, as one prepared script for a lent CUDA machine (H200).
# Real 7B front-end config and a Kyutai-STT-shaped model with random bf16
# weights (no checkpoint can reach that machine): engine tick time and peak
# memory at batch 1/8/32/64 with attach/detach, CUDA graphs on and off.
# Targets: <= 40 ms a tick at batch 8, the largest batch under 80 ms (front-end);
# 64 STT sessions within one 80 ms frame.
# Usage (from the repo root, with kame importable): bash bench/gpu_check.sh
set -uo pipefail
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
[ -d .venv ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
$PY bench/gpu_bench.py --graphs on --batches 1,8,32,64 --steps 60
$PY bench/gpu_bench.py --graphs off --batches 1,8 --steps 30
$PY bench/gpu_bench.py --stt --graphs on --batches 1,8,32,64 --steps 40
