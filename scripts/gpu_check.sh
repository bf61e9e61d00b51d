#!/usr/bin/env bash
# One-GPU smoke check of the scale path (about 8 minutes on one modern GPU):
#   1. a short SCORE run of a ~200M-parameter Qwen2-architecture model built from config (no download),
#      FSDP2 on 1 device, bf16, HF engine;
#   2. the same with the vLLM engine, if vllm is importable;
# then prints step time split into rollout / scoring / update / weight sync, peak GPU memory and tokens/s.
# Usage: bash scripts/gpu_check.sh [python]   (default: .venv/bin/python if present, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${GPU_CHECK_OUT:-logs/gpu_check}
MODEL="model.tiny.hidden_size=1024 model.tiny.intermediate_size=2816 model.tiny.num_hidden_layers=16
       model.tiny.num_attention_heads=16 model.tiny.num_key_value_heads=4 model.tiny.vocab_size=4096"
COMMON="experiment=tiny_score sft.enabled=false $MODEL trainer.accelerator=gpu trainer.devices=1 trainer.precision=bf16-mixed
        strategy=fsdp strategy.mixed_precision=bf16 trainer.max_steps=6 data.batch_size=4 optim.mini_batch_size=2
        solver.num_rollouts=8 solver.max_response_tokens=512 evaluator.max_response_tokens=384 optim.micro_batch_size=8
        trainer.enable_progress_bar=false callbacks.collapse_guard.enabled=false"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; print('GPU:', torch.cuda.get_device_name(0))"
rm -rf "$OUT"
"$PY" src/train.py $COMMON rollout=hf paths.output_dir="$OUT/hf"
if "$PY" -c "import vllm" 2>/dev/null; then
  "$PY" src/train.py $COMMON rollout=vllm rollout.gpu_memory_utilization=0.3 paths.output_dir="$OUT/vllm"
else
  echo "vllm not importable: skipping the vLLM engine check"
fi
"$PY" scripts/summarize_run.py "$OUT"/*/
