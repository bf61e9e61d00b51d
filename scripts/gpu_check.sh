#!/usr/bin/env bash
# One-shot check of the one-GPU path (sized for about 8 minutes on one GPU; scripts/gpu_check.py says what
# each part does): FSDP2 + bf16 on one device with the HF engine, LoRA, and vLLM when installed, on a
# random-weight Qwen2 model sized like Qwen2.5-0.5B with the real Qwen2.5 tokenizer. Prints each part as
# passed / failed / not installed / not available, then tokens/s, peak GPU memory and the SCORE-step
# time split per part; exits non-zero on any failure.
# Usage: bash scripts/gpu_check.sh [--cpu-smoke] [--only fsdp2-bf16-hf lora vllm] [--steps 3] [--budget-s 600] [--part-timeout-s 300]
#   GPU_CHECK_PYTHON=...  the interpreter (default: .venv/bin/python if present, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${GPU_CHECK_PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PY" scripts/gpu_check.py "$@"
