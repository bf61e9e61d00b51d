"""Rubric demos, and the random harness states and rubrics the other kinds reuse.

Prompt: :func:`rubric_messages` for a random valid harness state (k, must-include, weight bounds,
notes; half of them the run's initial state), scheduler hints, and each query's initial evidence
D_q^0 (the retriever's top ``solver.topk`` documents with their titles), exactly as RL's rubric prompt. Response: a short
``<think>k = 3.</think>`` (mostly), then a ``<dimensions>`` block that satisfies the constraints:
must-include first, the other dimensions in pool order, weights from a fixed per-k profile
(:data:`WEIGHT_PROFILES`) when the bounds allow. Many different rubrics per prompt. The response
ends at ``</dimensions>``, where RL generation stops.

Why the format is so regular: a ~1.5M-parameter model trained from scratch for a few CPU minutes
learns local patterns (spelling, "previous weight -> next weight") but not to copy a number from
the prompt, so it writes the initial state's k from its prior. Canonical order and per-k weight
profiles turn "count to k" and "sum to 1" into chains of local decisions; the variety RL needs is
in the choice of dimensions (and in the solver's searches and answers).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from score_lightning import protocol as P
from score_lightning.harness.state import HarnessState
from score_lightning.roles.evidence import evidence_from_hits
from score_lightning.roles.prompts import rubric_messages
from score_lightning.roles.rubric import Rubric, fallback_rubric
from score_lightning.sft.context import DemoContext
from score_lightning.rollout.chat import encode_chat
from score_lightning.sft.demo_types import RUBRIC, Demo, encode

#: k of the other states (weights); the base state's k is drawn with probability BASE_K_PROB instead
_K_WEIGHTS = {2: 0.1, 3: 0.3, 4: 0.3, 5: 0.2, 6: 0.1}
#: share of states that are exactly the base (initial) state, and of the others that keep its k
BASE_STATE_PROB, BASE_K_PROB = 0.5, 0.6
_NOTE_TEMPLATES = (
    "rule-based harness v{v}: no rule fired; constraints unchanged.",
    "rule-based harness v{v}: reward_std 0.000 < 0.050 (saturated): k {a}->{b}, require gap analysis.",
    "rule-based harness v{v}: verified_rate 0.00 < 0.50: verify claims by search, min_number_of_tool_call {a}->{b}.",
    "rule-based harness v{v}: rubric_valid_rate 0.20 < 0.50: relax weight bounds.",
    "Prefer dimensions that separate grounded reports from unsupported ones.",
    "Check citations carefully.",
)


def random_state(rng: random.Random, base: HarnessState, max_eval_tool_calls: int) -> HarnessState:
    """A valid harness state around ``base``: k, must-include, weight bounds, process rules, notes.

    Half the states are ``base`` itself (what RL sees until the harness first changes it), and most
    others keep its k: about 80% of demos use the base k. The tiny model does not learn to *read*
    k from the prompt within the SFT budget, so its k comes from this prior; the other k values are
    still shown (every k in 2..6), for RL to build on.
    """
    if rng.random() < BASE_STATE_PROB:
        return HarnessState.from_dict(base.to_dict())
    pool = list(base.dimension_pool)
    base_k = base.dimension_constraints.k
    ks = [k for k in _K_WEIGHTS if k <= len(pool) and k != base_k]
    if rng.random() < BASE_K_PROB or not ks:
        k = base_k
    else:
        k = rng.choices(ks, weights=[_K_WEIGHTS[x] for x in ks])[0]
    must = list(base.dimension_constraints.must_include)
    r = rng.random()
    if r < 0.08:
        must = []
    elif r < 0.16 and k >= 2:
        extra = rng.choice([d for d in pool if d not in must])
        must = must + [extra]
    must = must[:k]
    lows = [w for w in (0.0, 0.05, 0.1, 0.15) if k * w <= 1.0 + 1e-9]
    highs = [w for w in (0.4, 0.5, 0.6, 0.7, 0.8) if k * w >= 1.0 - 1e-9]
    profile = WEIGHT_PROFILES.get(k)
    if profile is not None and rng.random() < 0.9:  # mostly bounds the k's weight profile fits
        lows = [w for w in lows if w <= min(profile) + 1e-9] or lows
        highs = [w for w in highs if w >= max(profile) - 1e-9] or highs
    wmin, wmax = rng.choice(lows), rng.choice(highs)
    v = rng.randint(1, 6)
    note = "" if rng.random() < 0.6 else rng.choice(_NOTE_TEMPLATES).format(v=v, a=max(1, k - 1), b=k)
    data = {
        "dimension_constraints": {"k": k, "must_include": must, "weight_min": wmin, "weight_max": wmax},
        "process_constraints": {
            "require_gap_analysis": rng.random() < 0.35,
            "require_verification": rng.random() < 0.45,
            "citation_cross_check": rng.random() < 0.3,
            "min_number_of_tool_call": rng.randint(0, min(2, max_eval_tool_calls)),
        },
        "notes": note,
        "version": v,
    }
    return HarnessState.from_dict(data, base=base)


def _split(total: float, n: int) -> list[float]:
    """``n`` two-decimal weights summing exactly to ``total`` (earlier entries take the remainder)."""
    cents = int(round(total * 100))
    base, rem = divmod(cents, n)
    return [(base + (1 if i < rem else 0)) / 100 for i in range(n)]


#: One fixed weight profile per k (each sums to exactly 1). No value appears in two profiles, so the
#: next weight - and whether the list is complete - follows from the previous weight alone, and the
#: first weight encodes k: a chain of local decisions a tiny model can learn, instead of counting.
WEIGHT_PROFILES: dict[int, tuple[float, ...]] = {
    1: (1.0,),
    2: (0.60, 0.40),
    3: (0.50, 0.30, 0.20),
    4: (0.35, 0.25, 0.22, 0.18),
    5: (0.28, 0.24, 0.19, 0.16, 0.13),
    6: (0.27, 0.21, 0.15, 0.14, 0.12, 0.11),
}


def weight_plans(k: int, wmin: float, wmax: float) -> list[tuple[float, ...]]:
    """Weight vectors for k dimensions that sum to 1 and respect the bounds, preferred first.

    The fixed profile :data:`WEIGHT_PROFILES` ``[k]`` when it fits the bounds, then equal weights
    (1/k to two decimals, e.g. 0.34/0.33/0.33), then primary-heavy plans (the first dimension gets
    0.4-0.6, the rest an equal share).
    """
    plans: list[tuple[float, ...]] = []
    if k in WEIGHT_PROFILES:
        plans.append(WEIGHT_PROFILES[k])
    plans.append(tuple(_split(1.0, k)))
    if k >= 2:
        for p in (0.4, 0.5, 0.6):
            if p > 1.0 / k + 0.02:
                plans.append((p, *_split(1.0 - p, k - 1)))
    return [pl for pl in dict.fromkeys(plans) if all(wmin - 1e-9 <= w <= wmax + 1e-9 for w in pl)]


def random_rubric(
    rng: random.Random, state: HarnessState, required: Sequence[str] = (), avoided: Sequence[str] = (),
    explore: Sequence[str] = (), preferred_weight_prob: float = 1.0,
) -> Rubric:
    """A rubric satisfying ``state``, written in a canonical order.

    Must-include dimensions first, then the chosen ones in *pool order* (so "which comes next" only
    depends on the previous name, and a repeat never looks likely); hints are followed (required
    included, avoided left out, explore tried); weights: the first (preferred) plan of
    :func:`weight_plans` with probability ``preferred_weight_prob``, else another valid plan.
    """
    dc = state.dimension_constraints
    pool = list(state.dimension_pool)
    must = list(dict.fromkeys(dc.must_include))
    chosen: list[str] = []

    def free(d: str) -> bool:
        return d in pool and d not in must and d not in chosen

    for d in required:
        if len(must) + len(chosen) < dc.k and free(d):
            chosen.append(d)
    for d in explore:
        if len(must) + len(chosen) < dc.k and free(d) and rng.random() < 0.6:
            chosen.append(d)
    missing = dc.k - len(must) - len(chosen)
    rest = [d for d in pool if free(d) and d not in avoided]
    if len(rest) < missing:
        rest = [d for d in pool if free(d)]
    chosen.extend(rng.sample(rest, missing))
    dims = must + sorted(chosen, key=pool.index)
    plans = weight_plans(dc.k, dc.weight_min, dc.weight_max)
    if not plans:
        return fallback_rubric(state)
    weights = plans[0] if (rng.random() < preferred_weight_prob or len(plans) == 1) else rng.choice(plans[1:])
    return Rubric(tuple(dims), tuple(weights))


def rubric_response(rubric: Rubric, k: int, think: bool) -> str:
    """``<think>k = 3.</think><dimensions>...</dimensions>``: the think restates k right before the list."""
    head = f"{P.THINK_OPEN}k = {k}.{P.THINK_CLOSE}" if think else ""
    return head + rubric.to_xml()


def rubric_group(ctx: DemoContext, rng: random.Random, n: int) -> list[Demo]:
    """``n`` different valid rubrics for one rubric prompt (state, queries, scheduler hints)."""
    b = ctx.b
    state = random_state(rng, ctx.base, b.evaluator_max_tool_calls)
    n_q = rng.choices([1, 2, 3], weights=[0.25, 0.6, 0.15])[0]
    queries = rng.sample(ctx.queries, min(n_q, len(ctx.queries)))
    pool = list(state.dimension_pool)
    required: list[str] = []
    avoided: list[str] = []
    explore: list[str] = []
    r = rng.random()
    if r < 0.45:  # early RL: every dimension is still unexplored, hints name the first two of the pool
        start = rng.choice([0, 0, rng.randrange(len(pool))])
        explore = pool[start : start + 2]
    elif r < 0.75:
        others = [d for d in pool if d not in state.dimension_constraints.must_include]
        rng.shuffle(others)
        required = others[: rng.randint(0, 1)]
        avoided = others[1 : 1 + rng.randint(0, 2)]
        explore = others[3 : 3 + rng.randint(0, 2)]
    evidence = evidence_from_hits(ctx.retriever.search(queries, b.topk))  # D_q^0, as the RL rubric prompt shows it
    prompt = encode_chat(ctx.tok, rubric_messages(queries, state, required, avoided, explore, evidence=evidence))
    if len(prompt) > b.max_prompt_tokens:
        return []
    out = []
    for _ in range(n):
        for think in (rng.random() < 0.9, False):
            rubric = random_rubric(rng, state, required, avoided, explore)
            text = rubric_response(rubric, state.dimension_constraints.k, think)
            ids = encode(ctx.tok, text)
            if len(ids) <= b.max_rubric_tokens:
                out.append(Demo(RUBRIC, prompt, ids, [1] * len(ids), meta={
                    "state": state.to_dict(), "rubric": [list(rubric.dims), list(rubric.weights)],
                    "queries": queries, "hints": [required, avoided, explore],
                }))
                break
    return out
