"""``optim.rollout_correction``'s modes and what ``auto`` means: plain names, read by the config checks before
torch loads and by :mod:`~score_lightning.step.rollout_correction`, which computes the weights."""

from __future__ import annotations

MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

#: what ``auto`` means with ``rollout.engine=vllm``. Token-level truncation rather than TRL's
#: ``sequence_mask``: SCORE's trajectories run to thousands of model tokens over many turns
#: (``qwen_score``: 4096), and a sequence ratio is a product over all of them. Its log is a sum whose
#: mean is -T * KL(mu || pi_old) and whose spread grows as sqrt(T): with a per-token mismatch of
#: 1e-3 nats a 4k-token report has rho ~ e^-4 ~ 0.02, so the longest reports lose their gradient
#: while short ones keep it, a length bias on top of the variance. Per-token truncation bounds
#: every weight by C_max whatever the length (TIS, Yao et al. 2025, as verl's token-level truncated IS).
AUTO_VLLM = "token_truncate"


def resolve_mode(value: str, engine: str, stale: bool = False) -> str:
    """``optim.rollout_correction`` as a mode: ``auto`` follows ``rollout.engine`` and ``rollout.mode``.

    ``auto`` is :data:`AUTO_VLLM` for vLLM and ``none`` for the HF and scripted engines: the HF engine
    samples from the trainer's own module, so behaviour and trainer log-probs are the same numbers
    and a correction would only add noise (the scripted engine's log-probs are a constant).
    ``stale`` (``rollout.mode=async`` with ``rollout.max_staleness >= 1``): the HF worker's log-probs come
    from an older policy version than the trainer's pi_old, so ``auto`` is :data:`AUTO_VLLM` there too
    (the per-token weight pi_old / mu then also corrects the staleness, as AReaL's decoupled PPO does);
    the scripted engine stays ``none``.
    """
    if value == "auto":
        return AUTO_VLLM if engine == "vllm" or (stale and engine == "hf") else "none"
    if value not in MODES:
        raise ValueError(f"optim.rollout_correction={value!r}: allowed auto or one of {MODES}")
    return value
