"""The policy layer: loading policies and references (HF, tiny, GGUF), trainable parts (LoRA, top
layers), attention and log-prob kernels, shared-prefix packing, FSDP wrapping, export and checkpoint files."""
