"""LoRA (peft) for the policy: only adapters train, the KL reference is the base with adapters off.

Why it is built this way:

* **The policy stays the HF model itself**, with peft's LoRA layers injected in place
  (``peft.inject_adapter_in_model``) rather than wrapped in a ``PeftModel``. Every consumer (HF
  ``generate``, ``policy_logprobs`` with ``logits_to_keep`` and the fused LM head, FSDP2's
  ``_no_split_modules``, gradient checkpointing, Lightning checkpoints) keeps seeing an ordinary
  causal LM, and the base weights are frozen by peft so the optimiser only receives adapters.
* **The KL reference is a view, not a copy** (:class:`ReferenceModel`): the policy's own forward
  under :func:`adapters_disabled` and ``torch.no_grad``. It registers no parameters, so the
  checkpoint, DDP and FSDP2 never see the policy's weights twice, and the step stages that take a
  ``ref`` module are unchanged.
* **vLLM and exports get merged weights** (:func:`merge_lora`): ``W + scaling * B @ A`` per target
  module, under the base model's HF names, computed from gathered copies one module at a time. The
  training weights are never mutated (no ``merge_adapter``/``unmerge`` round trip that would
  perturb them in low precision), and an engine without LoRA support samples the current policy.
* **The adapter is also exported in PEFT's own format** (:func:`save_adapter`), so
  ``PeftModel.from_pretrained(base, "export/adapter")`` works for users who prefer it.

peft is imported lazily: without ``model.lora.enabled`` nothing here needs it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: the single adapter the policy carries (peft's default name)
ADAPTER = "default"
_BASE = re.compile(r"^(?P<prefix>.+)\.base_layer\.(?P<leaf>weight|bias)$")
_LORA = re.compile(r"^(?P<prefix>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")


def lora_enabled(lora_cfg: Mapping[str, Any] | None) -> bool:
    """``model.lora.enabled`` (or ``sft.lora``'s, or a packaged adapter's manifest entry); None (a checkpoint
    stored before LoRA existed: :func:`~score_lightning.policy.export.export_checkpoint`) means LoRA is off."""
    return bool(lora_cfg is not None and lora_cfg["enabled"])


def lora_config(lora_cfg: Mapping[str, Any]):
    """A ``peft.LoraConfig`` from a ``lora`` node or its plain copy (``r``, ``alpha``, ``target_modules``,
    ``dropout``: every one is set wherever a ``lora`` block is, in the config or a manifest)."""
    from peft import LoraConfig

    targets = lora_cfg["target_modules"]
    targets = targets if isinstance(targets, str) else [str(t) for t in targets]
    return LoraConfig(r=int(lora_cfg["r"]), lora_alpha=float(lora_cfg["alpha"]),
                      target_modules=targets, lora_dropout=float(lora_cfg["dropout"]), bias="none",
                      task_type="CAUSAL_LM")


def apply_lora(model: nn.Module, lora_cfg: Mapping[str, Any], base_name_or_path: str | None = None) -> nn.Module:
    """Inject LoRA layers into ``model`` in place and freeze everything else; returns ``model``.

    Only ``nn.Linear`` targets are accepted: they are what :func:`merge_lora` knows how to merge
    for vLLM and the export (embeddings or convolutions would need other formulas).
    """
    from peft import inject_adapter_in_model
    from peft.tuners.lora import Linear as LoraLinear

    config = lora_config(lora_cfg)
    config.base_model_name_or_path = base_name_or_path
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"model.lora.target_modules={config.target_modules!r} matched no layer of "
                         f"{type(model).__name__}")
    bad = sorted({type(m).__name__ for m in layers if not isinstance(m, LoraLinear)})
    if bad:
        raise ValueError(f"model.lora.target_modules: only nn.Linear layers are supported, not {bad}")
    for name, p in model.named_parameters():  # peft freezes the base; make it an invariant, not a hope
        p.requires_grad_(".lora_" in name)
    return model


def lora_layers(model: nn.Module) -> list[nn.Module]:
    """peft's tuner layers inside ``model`` (empty for a model without LoRA)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # peft not installed: no model can carry LoRA layers
        return []
    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def is_lora(model: nn.Module | None) -> bool:
    return model is not None and bool(lora_layers(model))


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Within the block ``model`` computes with its base weights only.

    peft's ``enable_adapters(False/True)`` also rewrites ``requires_grad`` of the adapters (off,
    then on for the active adapter), which must not be seen by anyone: FSDP2 reads the flags once,
    at its lazy initialisation on the model's first forward (which may be this reference forward),
    to pick its trainable parameters and their reduce dtype (``_init_mp_dtypes``); without the
    restore below, LoRA on 2 FSDP2 processes ended 2.5e-3 away from 1 process. And a frozen adapter
    (``solver.freeze``) would come back trainable. So the flags are restored right after disabling
    (the forward skips the adapters whatever their flags) and again on exit.
    """
    layers = lora_layers(model)
    flags = [(p, p.requires_grad) for layer in layers for p in layer.parameters()]

    def restore() -> None:
        for p, flag in flags:
            p.requires_grad_(flag)

    for layer in layers:
        layer.enable_adapters(False)
    restore()
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        restore()


class ReferenceModel(nn.Module):
    """The frozen KL reference of a LoRA policy: the policy's forward with adapters disabled.

    The policy is held outside ``nn.Module``'s registry, so this module owns no parameters: no
    second copy of the base in memory, in checkpoints, or in DDP/FSDP2's parameter lists. It
    offers what ``policy_logprobs`` uses (``forward`` with ``logits_to_keep``,
    ``get_output_embeddings``, ``config``). Under FSDP2 its forward is the policy's, hence
    collective, like the separate reference it replaces.
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        object.__setattr__(self, "policy", policy)

    @property
    def config(self):
        return self.policy.config

    def get_output_embeddings(self) -> nn.Module | None:
        return self.policy.get_output_embeddings()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                logits_to_keep: int | torch.Tensor | None = None, **kwargs: Any):
        if logits_to_keep is not None:
            kwargs["logits_to_keep"] = logits_to_keep
        with torch.no_grad(), adapters_disabled(self.policy):
            return self.policy(input_ids=input_ids, attention_mask=attention_mask, **kwargs)


def lora_scalings(model: nn.Module) -> dict[str, float]:
    """``{hf module name: alpha / r}`` (or rsLoRA's scale) for every LoRA layer of ``model``."""
    from score_lightning.policy.fsdp import hf_name

    out = {}
    for name, m in model.named_modules():
        scaling = getattr(m, "scaling", None)
        if isinstance(scaling, dict) and ADAPTER in scaling and hasattr(m, "lora_A"):
            if getattr(m, "fan_in_fan_out", False):
                raise ValueError(f"{name}: fan_in_fan_out LoRA layers (GPT-2 Conv1D) are not supported")
            out[hf_name(name)] = float(scaling[ADAPTER])
    return out


def merge_lora(named: Iterable[tuple[str, torch.Tensor]], scalings: Mapping[str, float]
               ) -> Iterator[tuple[str, torch.Tensor]]:
    """Turn a LoRA model's ``(name, tensor)`` stream into the base model's, with adapters merged.

    ``q_proj.base_layer.weight`` + ``q_proj.lora_A/B.default.weight`` become one
    ``q_proj.weight = W + scaling * B @ A`` (computed in float32, cast to W's dtype); other tensors
    pass through. Only one module's tensors are held at a time (state-dict order keeps a layer's
    base weight and its A/B together), so a streamed weight sync stays one-parameter-at-a-time.
    With no scalings (not a LoRA model) the stream is returned unchanged.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in named:
        base, lora = _BASE.match(name), _LORA.match(name)
        if base is not None and base["leaf"] == "bias":
            yield f"{base['prefix']}.bias", t
            continue
        if base is None and lora is None:
            if ".lora_" in name:
                raise ValueError(f"{name}: a LoRA tensor merge_lora cannot merge (only nn.Linear LoRA is supported)")
            yield name, t
            continue
        if lora is not None and lora["adapter"] != ADAPTER:
            raise ValueError(f"{name}: only the {ADAPTER!r} adapter can be merged")
        prefix = (base or lora)["prefix"]
        parts = pending.setdefault(prefix, {})
        parts["W" if base is not None else lora["ab"]] = t
        if len(parts) == 3:
            del pending[prefix]
            w = parts["W"]
            delta = (parts["B"].float() @ parts["A"].float()) * scalings[prefix]
            yield f"{prefix}.weight", (w.float() + delta.to(w.device)).to(w.dtype)
    if pending:
        raise ValueError(f"incomplete LoRA layers in the weights: {sorted(pending)[:3]}")


def iter_merged_params(model: nn.Module, to_cpu: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, full tensor)`` of the model an engine without LoRA support must load.

    :func:`~score_lightning.policy.fsdp.iter_full_params` with LoRA layers merged (a plain model passes
    through unchanged). Collective under FSDP2: every rank must consume it.
    """
    from score_lightning.policy.fsdp import iter_full_params

    scalings = lora_scalings(model)
    params = iter_full_params(model, to_cpu=to_cpu)
    return merge_lora(params, scalings) if scalings else params


def save_adapter(model: nn.Module, state: Mapping[str, torch.Tensor], out_dir: str | Path) -> Path:
    """Write the adapter in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``).

    ``state`` is the model's full state dict with HF names (gathered under FSDP2). The keys carry
    ``PeftModel``'s ``base_model.model.`` prefix, so ``PeftModel.from_pretrained(base, out_dir)``
    loads it exactly as if ``PeftModel.save_pretrained`` had written it.
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    adapter = get_peft_model_state_dict(model, state_dict=dict(state), adapter_name=ADAPTER)
    save_file({f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in adapter.items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    model.peft_config[ADAPTER].save_pretrained(str(out))
    return out
