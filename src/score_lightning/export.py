"""Export a policy from any training checkpoint (e.g. after preemption): ``scripts/export.py CKPT OUT``.

A run exports ``export/`` itself when it finishes; a preempted or halted run leaves only
``checkpoints/last.ckpt``. This rebuilds the policy from the checkpoint's own record of its base
model (``hyper_parameters.model_path``), loads the trained weights and writes an HF
``save_pretrained`` directory with the tokenizer, loadable by HF and vLLM. FSDP sharded checkpoint
directories are converted with ``torch.distributed.checkpoint`` first.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

POLICY_PREFIX = "policy."


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


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path, model_path: str | None = None) -> Path:
    """Write ``out_dir`` as an HF checkpoint of the policy saved in ``ckpt_path``."""
    from transformers import AutoModelForCausalLM

    from score_lightning.models import load_tokenizer

    ckpt = load_checkpoint(ckpt_path)
    hp = ckpt.get("hyper_parameters", {})
    base = model_path or hp.get("model_path")
    if not base:
        raise ValueError("the checkpoint does not name its base model; pass --model-path")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(policy_state_dict(ckpt), strict=False)
    if unexpected or [m for m in missing if "rotary" not in m]:
        raise ValueError(f"checkpoint does not match {base}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    template = ((hp.get("cfg") or {}).get("model") or {}).get("chat_template")
    load_tokenizer(hp.get("tokenizer_path") or base, chat_template=template).save_pretrained(out)
    return out
