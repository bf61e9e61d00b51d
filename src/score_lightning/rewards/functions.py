"""SCORE's reward arithmetic as pure functions (plus the small stateful EMA baseline).

* solver reward R_s(r) = a(r) · (1 + Σ_j w_j · s_j(r)), scores s_j in [0, 1];
* reward verifier: a report whose evaluator search depth is below τ_s gets reward 0 (Algorithm 1,
  line 23), or, in the softer ``verifier.zero=scores`` variant, scores 0 so that its reward falls
  to a(r) · 1 (the evaluator's unverified opinion is not trusted);
* evaluator reward: consistency C_i = mean over pairs k<l of TF-IDF cosine of the K reports'
  conclusions, R_eval = mean_i C_i;
* EMA baseline for the evaluator's REINFORCE advantage: Â = R − b_{t−1}, b_t = β b_{t−1} + (1−β) R.

Kept free of Lightning so the maths is testable against hand computations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics.pairwise import cosine_similarity
from torch import Tensor


def apply_verifier(values: Tensor, depth: Tensor, min_depth: int, enabled: bool = True) -> tuple[Tensor, Tensor]:
    """Zero the rows of reports whose verification depth is below ``min_depth`` (the reward verifier).

    ``values`` is ``[N]`` (rewards: Algorithm 1, line 23 sets s_i^k to 0) or ``[N, k]`` (scores:
    the softer variant that keeps a(r)); ``depth`` is ``[N]``, the number of evaluator searches
    behind each report's scores. Returns ``(values', verified)`` with ``verified = depth >= min_depth``
    (bool ``[N]``). With ``enabled=False`` (the "no verifier" ablation) the values come back unchanged
    but ``verified`` is still reported, so the verified rate stays observable. Never in-place.
    """
    if values.dim() not in (1, 2) or depth.dim() != 1 or values.shape[0] != depth.shape[0]:
        raise ValueError(
            f"apply_verifier: need values [N] or [N,k] and depth [N], got {tuple(values.shape)} and {tuple(depth.shape)}"
        )
    verified = depth >= min_depth
    if not enabled:
        return values.clone(), verified
    keep = verified.unsqueeze(-1) if values.dim() == 2 else verified
    return torch.where(keep, values, torch.zeros_like(values)), verified


def solver_reward(validity: Tensor, scores: Tensor, weights: Tensor) -> Tensor:
    """R_s = a · (1 + Σ_j w_j s_j): ``validity`` ``[N]``, ``scores`` ``[N, k]``, ``weights`` ``[N, k]`` or ``[k]``.

    The "1 +" keeps a valid but badly scored report above an invalid one (which gets 0).
    """
    if scores.dim() != 2 or validity.shape != scores.shape[:1] or weights.shape[-1] != scores.shape[-1]:
        raise ValueError(
            f"solver_reward: need validity [N], scores [N,k], weights [N,k] or [k]; got "
            f"{tuple(validity.shape)}, {tuple(scores.shape)}, {tuple(weights.shape)}"
        )
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    weighted = (weights.to(scores.dtype) * scores).sum(dim=-1)
    return validity.to(scores.dtype) * (1.0 + weighted)


def verified_rewards(
    validity: Tensor, scores: Tensor, weights: Tensor, depth: Tensor, min_depth: int,
    enabled: bool = True, zero: str = "reward",
) -> tuple[Tensor, Tensor, Tensor]:
    """R_s with the reward verifier: ``(rewards [N], scores [N,k] as used, verified [N])``.

    ``zero="reward"`` (Algorithm 1, line 23): an under-verified report's reward is 0, so the group
    advantages see it as the worst report. ``zero="scores"``: only its scores are 0 and it keeps
    the validity term a(r), the softer variant.
    """
    if zero == "scores":
        scores, _ = apply_verifier(scores, depth, min_depth, enabled)
    rewards, _, verified = rewards_from_parts(validity, (scores * weights).sum(dim=-1), depth, min_depth, enabled, zero)
    return rewards, scores, verified


def rewards_from_parts(
    validity: Tensor, rubric_part: Tensor, depth: Tensor, min_depth: int, enabled: bool = True, zero: str = "reward",
) -> tuple[Tensor, Tensor, Tensor]:
    """R_s = a · (1 + part) with the reward verifier, from each report's rubric part ``part = Σ_j w_j s_j``.

    The per-report form serves rubrics that differ by query (given or evolving rubrics have their own
    items). Returns ``(rewards [N], parts as used [N], verified [N])``.
    """
    if zero not in ("reward", "scores"):
        raise ValueError(f"verifier.zero={zero!r}: allowed 'reward' or 'scores'")
    if zero == "scores":
        rubric_part, verified = apply_verifier(rubric_part, depth, min_depth, enabled)
        return validity.to(rubric_part.dtype) * (1.0 + rubric_part), rubric_part, verified
    rewards, verified = apply_verifier(validity.to(rubric_part.dtype) * (1.0 + rubric_part), depth, min_depth, enabled)
    return rewards, rubric_part, verified


def pairwise_tfidf_consistency(conclusions: Sequence[str]) -> float:
    """C = mean over pairs k<l of the TF-IDF cosine of the conclusions (vectorizer fit on these K).

    Empty conclusions are zero vectors (cosine 0 with everything). If nothing has a usable
    token the vectorizer fails and the consistency is 0.0. Fewer than two conclusions have no
    pairs, which is a caller bug: ``ValueError``.
    """
    texts = ["" if c is None else str(c) for c in conclusions]
    if len(texts) < 2:
        raise ValueError(f"pairwise_tfidf_consistency needs at least 2 conclusions, got {len(texts)}")
    try:
        matrix = TfidfVectorizer().fit_transform(texts)
    except ValueError:  # empty vocabulary: all conclusions empty or stop-word-free of tokens
        return 0.0
    sim = cosine_similarity(matrix)
    k = len(texts)
    total = math.fsum(float(sim[a, b]) for a in range(k) for b in range(a + 1, k))
    return min(max(total / (k * (k - 1) / 2), 0.0), 1.0)


def group_consistency(groups: Sequence[Sequence[str]]) -> tuple[list[float], float]:
    """Per-query consistencies C_i and the evaluator reward R_eval = mean_i C_i."""
    if len(groups) == 0:
        raise ValueError("group_consistency needs at least one group")
    per_query = [pairwise_tfidf_consistency(g) for g in groups]
    return per_query, math.fsum(per_query) / len(per_query)


def consistency_over_valid(conclusions: Sequence[str], valid: Sequence[bool], min_valid: int = 2) -> float | None:
    """C_i over the group's *valid* reports only; ``None`` when fewer than ``min_valid`` are valid.

    Consistency is meant to measure how reproducible the solver's conclusions are under a rubric.
    An invalid report (no answer, truncated, uncited) has no conclusion to compare; counting it as
    an empty text would make C_i track the format failure rate instead. A group with fewer than two
    valid reports has no pair and says nothing about reproducibility, so it is left out of R_eval.
    """
    kept = [c for c, ok in zip(conclusions, valid) if ok]
    if len(kept) < max(2, min_valid):
        return None
    return pairwise_tfidf_consistency(kept)


class EMABaseline:
    """Exponential moving average baseline b for the evaluator's REINFORCE advantage (b_0 = 0).

    Its state is part of the checkpoint: resuming with b reset to 0 would hand the evaluator a
    spuriously large advantage on the first step after resume.
    """

    def __init__(self, beta: float = 0.7, value: float = 0.0) -> None:
        beta = float(beta)
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"EMABaseline: beta={beta} must be in [0, 1)")
        self.beta = beta
        self.value = float(value)
        self.steps = 0

    def update(self, reward: float) -> tuple[float, float]:
        """Return ``(advantage, new_baseline)``: Â = R − b_{t−1}, b_t = β b_{t−1} + (1−β) R."""
        r = float(reward)
        if not math.isfinite(r):
            raise ValueError(f"EMABaseline.update: reward {r} is not finite")
        advantage = r - self.value
        self.value = self.beta * self.value + (1.0 - self.beta) * r
        self.steps += 1
        return advantage, self.value

    def state_dict(self) -> dict[str, Any]:
        return {"beta": self.beta, "value": self.value, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        beta = float(state["beta"])
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"EMABaseline: beta={beta} must be in [0, 1)")
        self.beta, self.value, self.steps = beta, float(state["value"]), int(state.get("steps", 0))


