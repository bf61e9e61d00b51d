"""Export a policy from any training checkpoint (e.g. after preemption): ``scripts/export.py CKPT OUT``.

A run exports ``export/`` itself when it finishes; a preempted or halted run leaves only
``checkpoints/last.ckpt``. This rebuilds the policy from the checkpoint's own record of its base
model (``hyper_parameters.model_path``), loads the trained weights and writes an HF
``save_pretrained`` directory with the tokenizer, loadable by HF and vLLM. FSDP sharded checkpoint
directories are converted with ``torch.distributed.checkpoint`` first. A LoRA run (``model.lora``)
is rebuilt with the same adapters, exported merged, and its adapter written to ``adapter/``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

POLICY_PREFIX = "policy."
#: where a LoRA run's export keeps the adapter (PEFT format), beside the merged model
ADAPTER_DIR = "adapter"


def load_checkpoint(path: str | Path) -> dict:
    """A Lightning checkpoint as one dict: a single file, or an FSDP directory (``meta.pt`` + shards)."""
    p = Path(path)
    if not p.is_dir():
        return torch.load(p, map_location="cpu", weights_only=False)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "full.pt"
        dcp_to_torch_save(str(p), str(flat))
        ckpt = torch.load(flat, map_location="cpu", weights_only=False)
    meta = torch.load(p / "meta.pt", map_location="cpu", weights_only=False)
    return {**meta, **ckpt}


def policy_state_dict(ckpt: dict) -> dict[str, torch.Tensor]:
    """The policy's weights with HF parameter names (wrapper prefixes removed)."""
    state = ckpt.get("state_dict", ckpt)
    out = {}
    for key, value in state.items():
        if key.startswith(POLICY_PREFIX) and isinstance(value, torch.Tensor):
            name = key[len(POLICY_PREFIX):].replace("_checkpoint_wrapped_module.", "")
            out[name] = value.full_tensor() if hasattr(value, "full_tensor") else value
    if not out:
        raise ValueError("the checkpoint holds no policy.* weights: not a score-lightning training checkpoint")
    return out


def save_policy(model: nn.Module, out_dir: str | Path, write: bool = True) -> Path:
    """``save_pretrained`` of ``model`` into ``out_dir``; collective under FSDP2 (every rank gathers).

    A LoRA policy is written twice over: the merged weights under the base model's names (what HF
    and vLLM load without peft) and the adapter alone in PEFT's format under ``adapter/``.
    ``write=False`` (ranks other than 0) only takes part in the gathers.
    """
    from score_lightning.policy.fsdp import full_state_dict
    from score_lightning.policy.lora import is_lora, lora_scalings, merge_lora, save_adapter

    out = Path(out_dir)
    state = full_state_dict(model)
    if not write:
        return out
    out.mkdir(parents=True, exist_ok=True)
    if is_lora(model):
        save_adapter(model, state, out / ADAPTER_DIR)
        state = dict(merge_lora(((k, state.pop(k)) for k in list(state)), lora_scalings(model)))
    model.save_pretrained(out, state_dict=state, safe_serialization=True)
    return out


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path, model_path: str | None = None) -> Path:
    """Write ``out_dir`` as an HF checkpoint of the policy saved in ``ckpt_path``."""
    from score_lightning.policy.models import load_policy, load_tokenizer

    ckpt = load_checkpoint(ckpt_path)
    hp = ckpt.get("hyper_parameters", {})
    base = model_path or hp.get("model_path")
    if not base:
        raise ValueError("the checkpoint does not name its base model; pass --model-path")
    # the checkpoint's stored config, which may predate a key: a model without a lora block trained without LoRA
    model_cfg = (hp.get("cfg") or {}).get("model") or {}  # data, not config
    # a LoRA run's checkpoint holds base_layer/lora_A/lora_B names: rebuild the same layers to load it
    model = load_policy(base, "float32", lora=model_cfg.get("lora"))  # data, not config
    missing, unexpected = model.load_state_dict(policy_state_dict(ckpt), strict=False)
    if unexpected or [m for m in missing if "rotary" not in m]:
        raise ValueError(f"checkpoint does not match {base}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    out = save_policy(model, out_dir)
    template = model_cfg.get("chat_template")  # data, not config
    load_tokenizer(hp.get("tokenizer_path") or base, chat_template=template).save_pretrained(out)
    if hp.get("cfg"):  # the run's resolved config, as the end-of-run export writes it: evaluation samples as it trained
        import json

        from score_lightning.data.run_config import RUN_CONFIG

        (out / RUN_CONFIG).write_text(json.dumps(hp["cfg"], indent=1))
    return out
