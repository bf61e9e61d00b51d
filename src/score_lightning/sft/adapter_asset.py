"""A cold start trained as a LoRA adapter (``sft.lora.enabled``), and rebuilt from that adapter alone.

Why: a real model's all-weights cold start is its full weights (SmolLM2-135M: 0.54 GB), too large to
ship in git, so every fresh clone trained it (38 minutes on one thread). Its LoRA adapter (r 8) is 9.8 MB.
The cache directory of a LoRA cold start holds both, as an RL export does
(:func:`~score_lightning.policy.export.save_policy`): the merged weights, which RL, vLLM and
``scripts/evaluate.py`` load as a plain checkpoint, and ``adapter/`` in PEFT's format, which is what
:mod:`~score_lightning.sft.asset` packages. Installing the package loads the base, sets the adapter
into the same LoRA layers and writes the merged weights with the same function, so an installed cold
start has the trained one's weights, configs and tokenizer file for file (the merge runs on one thread: a float
reduction in one order); only ``adapter/adapter_config.json`` differs, naming the local base checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from score_lightning.rng import preserved_rng

ADAPTER_DIR = "adapter"
_PEFT_PREFIX = "base_model.model."


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread inside the block (the merge's reductions in one order), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def save_cold_start(model: nn.Module, out: Path) -> None:
    """The LoRA cold start's files: merged weights (a plain checkpoint) and ``adapter/`` (what is packaged)."""
    from score_lightning.policy.export import save_policy

    with one_thread():
        save_policy(model, out)


def rebuild_from_adapter(base_path: str | Path, adapter: Path, out: Path, lora_cfg: Mapping[str, Any],
                         dtype: str = "float32") -> None:
    """Write the merged cold start into ``out`` from its base checkpoint and its packaged adapter.

    The adapter must fill every LoRA layer the config injects, and nothing else: a partial or foreign
    adapter raises instead of writing a model that is partly the base. Injecting the LoRA layers draws
    ``lora_A`` from the global generator before the adapter overwrites it: the RNG state is restored, so
    a run that installs the cold start (a fresh cache) samples as one that finds it cached.
    """
    with preserved_rng():
        _rebuild(base_path, adapter, out, lora_cfg, dtype)


def _rebuild(base_path: str | Path, adapter: Path, out: Path, lora_cfg: Mapping[str, Any], dtype: str) -> None:
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    from score_lightning.policy.lora import ADAPTER
    from score_lightning.policy.models import load_policy

    model = load_policy(base_path, dtype, lora=dict(lora_cfg, enabled=True))
    saved = {k[len(_PEFT_PREFIX):] if k.startswith(_PEFT_PREFIX) else k: v
             for k, v in load_file(str(adapter / "adapter_model.safetensors")).items()}
    expected = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    if set(saved) != set(expected):
        missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
        raise ValueError(f"adapter {adapter} does not fit the LoRA layers of {base_path} "
                         f"(sft.lora={dict(lora_cfg)}): missing {missing[:3]}, unexpected {extra[:3]}")
    bad = [k for k, v in saved.items() if v.shape != expected[k].shape]
    if bad:
        raise ValueError(f"adapter {adapter}: shapes differ from the LoRA layers of {base_path} at {bad[:3]}")
    set_peft_model_state_dict(model, saved, adapter_name=ADAPTER)
    model.eval()
    save_cold_start(model, out)


def adapter_files(built: Path) -> list[Path]:
    """What a LoRA cold start's package holds: every file but the merged weights (rebuilt on install)."""
    keep = [p for p in sorted(built.rglob("*")) if p.is_file() and p.name != "model.safetensors"]
    if not (built / ADAPTER_DIR / "adapter_model.safetensors").is_file():
        raise ValueError(f"{built} is not a LoRA cold start (no {ADAPTER_DIR}/adapter_model.safetensors)")
    return keep
