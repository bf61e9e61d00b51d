"""The policy layer: loading policies and references (HF, tiny, GGUF), trainable parts (LoRA, top
layers), attention and log-prob kernels, shared-prefix packing, FSDP wrapping, export and checkpoint files,
and the preflight that checks a model source (and the packages it needs) before any weight loads."""
