"""The model: its source (a path, a GGUF or the tiny spec), what trains (all weights, LoRA, top layers),
the dtype of the weights the optimiser updates, and the cold start that suits it."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from score_lightning.launch.config_validation.values import Checks
from score_lightning.sft.demo_types import SCORING_KINDS, kind_weights, report_shape

_DTYPES = {"float32", "fp32", "bfloat16", "bf16", "float16", "fp16"}  # models.resolve_dtype (no torch import here)
#: significant bits of each low-precision dtype (the stored mantissa plus the implicit one)
_SIGNIFICANT_BITS = {"bfloat16": 8, "bf16": 8, "float16": 11, "fp16": 11}
#: a typical weight magnitude of a trained transformer (init std ~0.02)
TYPICAL_WEIGHT = 0.02


def vanishing_lr(dtype: str) -> float:
    """The largest learning rate whose AdamW steps (~lr) round away on a typical weight in ``dtype``.

    Near w = 0.02 = 1.28 * 2^-6 the spacing is 2^-6 * 2^(1 - significant bits), and round-to-nearest
    keeps a weight whose step is under half of it: bf16 (8 bits) 6.1e-5, fp16 (11 bits) 7.6e-6.
    """
    import math

    exponent = math.floor(math.log2(TYPICAL_WEIGHT))
    return 0.5 * 2.0 ** (exponent + 1 - _SIGNIFICANT_BITS[dtype])


#: bf16's: the one the paper's recipes would meet (kept for callers that read one number)
LOW_PRECISION_MAX_LR = vanishing_lr("bf16")

#: SFT settings that only suit the from-scratch tiny model: (key, refused when, what they are for)
_FROM_SCRATCH_SFT = (("sft.lr", lambda v: v > 1e-4, "a from-scratch learning rate"),
                     ("sft.prompt_loss_weight", lambda v: v > 0, "loss on prompt tokens, to learn their language"))


#: a LoRA cold start's rate above this is refused on a pretrained model too (experiment=smol_score: 2e-3)
_LORA_SFT_MAX_LR = 1e-2


def pretrained_model(cfg: DictConfig) -> str | None:
    """What names a pretrained model: ``model.name_or_path``, else ``model.gguf`` (a GGUF inside an installed
    package, e.g. ``model=smollm2_135m``); ``None`` for the from-scratch tiny model."""
    path = cfg.model.name_or_path
    if path is not None:
        return str(path)
    gguf = cfg.model.gguf
    return f"{gguf.package}:{gguf.file}" if gguf is not None else None


def sft_enabled(cfg: DictConfig) -> bool:
    """``sft.enabled``: true, false, or ``auto``, on only for the tiny model (no pretrained model configured).

    Why ``auto``: ``experiment=tiny_score`` needs its cold start, but the same experiment pointed at a
    pretrained checkpoint must not run the tiny model's from-scratch settings on it.
    """
    value = cfg.sft.enabled
    if value == "auto":
        return pretrained_model(cfg) is None
    return value is True


def check_model(c: Checks) -> None:
    cfg = c.cfg
    if pretrained_model(cfg) is None and c.get("model.tiny") is None:
        c.add("model.name_or_path: null needs model.tiny (the tiny-model spec) or model.gguf; set a checkpoint "
              "path or use model=tiny")
    gguf = c.get("model.gguf")
    if c.get("model.name_or_path") is None and gguf is not None:
        from score_lightning.launch.gguf_checkpoint import gguf_problems  # light: no torch, no transformers

        c.errors.extend(gguf_problems(OmegaConf.to_container(gguf, resolve=True)))
    check_master_weights(c)
    template = c.get("model.chat_template")
    if isinstance(template, str) and template and "{" not in template and not Path(template).expanduser().is_file():
        c.add(f"model.chat_template={template!r}: neither a Jinja template nor a file")
    check_lora(c)
    check_trainable_layers(c)
    check_frozen_bottom_reuse(c)
    check_sft(c)


def check_master_weights(c: Checks) -> None:
    """``model.dtype`` is the dtype of the weights the optimiser updates (FSDP2 shards them as loaded).

    bf16 keeps 8 significant bits: near a weight of 0.02 its spacing is ~1.2e-4, so an AdamW step of
    ~lr rounds back to the same weight for every lr up to ~6.1e-5 (:func:`vanishing_lr`), and the run
    trains almost nothing, silently. The check covers both optimisers: the solver's lr and the
    evaluator's own ``evaluator.alpha * optim.lr``. Compute in bf16 comes from ``trainer.precision`` /
    ``strategy.mixed_precision`` instead.
    """
    dtype, lr = c.get("model.dtype"), c.get("optim.lr")
    if dtype not in _SIGNIFICANT_BITS or not isinstance(lr, (int, float)) or isinstance(lr, bool):
        return
    if c.get("model.allow_low_precision_weights") is True:
        return
    limit = vanishing_lr(dtype)
    rates = [("optim.lr", float(lr))]
    alpha = c.get("evaluator.alpha")
    own = c.get("evaluator.optimizer") == "own" or c.get("actor.shared") is False
    if c.get("evaluator.enabled") is True and own and isinstance(alpha, (int, float)) and alpha > 0:
        rates.append(("evaluator.alpha * optim.lr", float(alpha) * float(lr)))
    for name, rate in rates:
        if rate > limit:
            continue
        c.add(f"model.dtype={dtype!r} with {name}={rate:g}: the optimiser would update {dtype} master weights, "
              f"whose spacing near a weight of {TYPICAL_WEIGHT} makes every step of ~lr <= {limit:.2g} round away, "
              "so the run trains almost nothing; use model.dtype=float32 (bf16 compute comes from "
              "trainer.precision=bf16-mixed and strategy.mixed_precision=bf16), or set "
              "model.allow_low_precision_weights=true if the rounding is intended")


def check_lora(c: Checks) -> None:
    """``model.lora`` (absent means disabled): its values, peft installed, and what LoRA cannot do."""
    if c.get("model.lora.enabled") is not True:
        return
    names = lambda v: isinstance(v, ListConfig) and len(v) > 0 and all(isinstance(x, str) and x for x in v)  # noqa: E731
    c("model.lora.target_modules", lambda v: v == "all-linear" or names(v),
      "'all-linear' or a non-empty list of module names, e.g. [q_proj, v_proj]")
    from score_lightning.policy.preflight import missing_package

    line = missing_package("peft", "model.lora.enabled=true", "pip install -e '.[lora]'")
    if line:
        c.add(line)
    if c.get("actor.shared") is False:
        c.add("model.lora.enabled=true with actor.shared=false: a separate evaluator is not supported with "
              "LoRA. It would need a second full base model (what LoRA is meant to avoid) or a second "
              "adapter on the shared base, whose switching of peft's active adapter per role rewrites "
              "requires_grad and leaves one adapter unused in each backward (DDP, FSDP2); "
              "use actor.shared=true")


def check_trainable_layers(c: Checks) -> None:
    """``model.trainable_layers``: null or an integer >= 1, and not together with LoRA."""
    n = c.get("model.trainable_layers")
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        c.add(f"model.trainable_layers={n!r}: must be null (all weights train) or an integer >= 1 "
              "(the top N decoder layers and the final norm train)")
    if c.get("model.lora.enabled") is True:
        c.add("model.trainable_layers with model.lora.enabled=true: choose one way to train a part of the "
              "model (adapters in every layer, or the top N layers)")
    if c.get("strategy.name") == "fsdp":
        c.add("model.trainable_layers with strategy=fsdp: FSDP2 shards frozen and trainable weights alike and "
              "its reference would need the top layers' start sharded too; use strategy=ddp or single")


def check_frozen_bottom_reuse(c: Checks) -> None:
    """``optim.reuse_frozen_bottom`` needs frozen bottom layers, i.e. ``model.trainable_layers``."""
    if c.get("optim.reuse_frozen_bottom") is True and c.get("model.trainable_layers") is None:
        c.add("optim.reuse_frozen_bottom=true without model.trainable_layers: every layer trains, so there is no "
              "frozen bottom to run once; set model.trainable_layers=N or optim.reuse_frozen_bottom=false")


def check_sft(c: Checks) -> None:
    """Refuse the tiny model's cold-start settings on a pretrained checkpoint, naming the keys and the fix."""
    c("sft.enabled", lambda v: v in (True, False, "auto"), "true, false or 'auto' (on for the tiny model only)")
    weights = c.get("sft.scoring_kind_weights")
    try:  # the demo builder's own reading, so the two cannot disagree
        kind_weights(None if weights is None else dict(weights))
    except (TypeError, ValueError) as e:
        c.add(f"{e}" if str(e).startswith("sft.") else f"sft.scoring_kind_weights={weights!r}: allowed null or a "
              f"mapping of report kinds {list(SCORING_KINDS)} to weights >= 0 ({e})")
    try:  # the demo builder's own reading of the shape, so the two cannot disagree
        report_shape(c.get("sft.report"))
    except (KeyError, TypeError, ValueError) as e:
        c.add(f"sft.report={c.get('sft.report')!r}: allowed null (short answers) or "
              f"{{claims: [lo, hi], searches: [lo, hi]}} with 1 <= lo <= hi ({e})")
    if c.get("sft.lora.enabled") is True and c.get("sft.trainable_layers") is not None:
        c.add("sft.lora.enabled=true with sft.trainable_layers: choose one way to train a part of the model in the "
              "cold start (adapters in every layer, or the top N layers)")
    path = pretrained_model(c.cfg)
    if path is None or not sft_enabled(c.cfg):
        return
    lora = c.get("sft.lora.enabled") is True
    for key, bad, why in _FROM_SCRATCH_SFT:
        value = c.get(key)
        if key == "sft.lr" and lora:  # adapters start at zero and train at LoRA's usual 1e-4 to 3e-3
            bad = lambda v: v > _LORA_SFT_MAX_LR  # noqa: E731
        if isinstance(value, (int, float)) and bad(value):
            c.add(f"{key}={value!r} with a pretrained model.name_or_path={path!r}: {why}, one of the "
                  "from-scratch tiny model's settings (configs/sft/default.yaml); use sft=pretrained "
                  "(lr 1e-5, no prompt loss, bf16 on GPU, 1 epoch) or sft.enabled=false")
