"""Synthetic demonstrations for the supervised cold start, in the exact token format RL samples.

Three kinds, all built from the query set and the configured retriever (BM25 over the stdlib corpus
by default), deterministic given a seed:

* **solver** - prompt: the chat template of :func:`solver_messages` (a random valid rubric or the
  harness fallback); response: ``<think>``, 1..N ``<search>`` calls whose queries come from the
  question (dotted stdlib names, identifiers, keywords), each answered by the *real* observation,
  then an ``<answer>`` citing retrieved ids as ``[doc_id]`` with sentences taken from the retrieved
  passages, ending with ``Conclusion: ...``, then EOS. The multi-turn response is produced by
  running the project's own agent loop (:func:`run_agent`) with a scripted engine, so observation
  tokens, masks (0 on observations), the tool-budget notice and the length budget are exactly those
  of an RL rollout.
* **rubric** - prompt: :func:`rubric_messages` for a random valid harness state (k, must-include,
  weight bounds, notes; half of them the run's initial state) and scheduler hints; response: a short
  ``<think>k = 3.</think>`` (mostly), then a ``<dimensions>`` block that satisfies the constraints:
  must-include first, the other dimensions in pool order, weights from a fixed per-k profile
  (:data:`WEIGHT_PROFILES`) when the bounds allow. Many different rubrics per prompt. The response
  ends at ``</dimensions>``, where RL generation stops.
* **scoring** - prompt: :func:`scoring_messages` over K reports (solver-style answers, some
  deliberately degraded: no citations, invented citations, off-topic, cut short, missing);
  response: verification ``<search>`` calls with real observations, then ``<report_evaluations>``
  with ``<verification>``, ``<gap_analysis>`` and integer scores that follow report quality, then EOS.

Budgets (prompt, response, observation, rubric and report lengths, K, topk) come from the run's
config (:class:`DemoBudgets`), so the demonstrations look like what RL will sample. A demo that
does not fit is shortened and, failing that, dropped (counted in :class:`DemoStats`).

Why the rubric format is so regular: a ~1.5M-parameter model trained from scratch for a few CPU
minutes learns local patterns (spelling, "previous weight -> next weight") but not to copy a
number from the prompt, so it writes the initial state's k from its prior. Canonical order and
per-k weight profiles turn "count to k" and "sum to 1" into chains of local decisions; the
variety RL needs is in the choice of dimensions (and in the solver's searches and answers).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from score_lightning import protocol as P
from score_lightning.harness.state import HarnessState
from score_lightning.retrieval.base import Retriever, SearchHit
from score_lightning.roles.prompts import rubric_messages, scoring_messages, solver_messages
from score_lightning.roles.rubric import Rubric, fallback_rubric
from score_lightning.rollout.agent import AgentConfig, format_observation, run_agent
from score_lightning.rollout.engine import Generation, SamplingParams

log = logging.getLogger(__name__)

#: Bump whenever the generated demonstrations change, so cached SFT checkpoints are rebuilt.
DEMO_VERSION = 5

SOLVER, RUBRIC, SCORING = "solver", "rubric", "scoring"


# ---------------------------------------------------------------------------- data types
@dataclass
class Demo:
    """One supervised example: prompt ids (never trained) + response ids with a loss mask."""

    kind: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    #: what the tests need to re-check the demo with the project's parsers
    meta: dict = field(default_factory=dict)
    #: demos with the same group share one prompt (the trainer encodes it once for all of them)
    group: int = -1

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class DemoStats:
    built: dict = field(default_factory=lambda: {SOLVER: 0, RUBRIC: 0, SCORING: 0})
    dropped: dict = field(default_factory=lambda: {SOLVER: 0, RUBRIC: 0, SCORING: 0})


@dataclass(frozen=True)
class DemoBudgets:
    """The RL budgets the demonstrations must respect (same meaning as the config keys)."""

    max_prompt_tokens: int = 1024
    solver_max_response_tokens: int = 256
    solver_max_tool_calls: int = 3
    max_observation_tokens: int = 64
    topk: int = 2
    max_rubric_tokens: int = 96
    evaluator_max_response_tokens: int = 256
    evaluator_max_tool_calls: int = 2
    max_report_tokens: int = 96
    num_rollouts: int = 4

    @classmethod
    def from_cfg(cls, cfg) -> "DemoBudgets":
        s, e = cfg.solver, cfg.evaluator
        return cls(
            max_prompt_tokens=int(s.max_prompt_tokens), solver_max_response_tokens=int(s.max_response_tokens),
            solver_max_tool_calls=int(s.max_tool_calls), max_observation_tokens=int(s.max_observation_tokens),
            topk=int(s.topk), max_rubric_tokens=int(e.max_rubric_tokens),
            evaluator_max_response_tokens=int(e.max_response_tokens), evaluator_max_tool_calls=int(e.max_tool_calls),
            max_report_tokens=int(e.max_report_tokens), num_rollouts=int(s.num_rollouts),
        )

    def solver_agent(self) -> AgentConfig:
        """The solver's agent config, built as ``ScoreModule.rollout`` builds it."""
        return AgentConfig(max_tool_calls=self.solver_max_tool_calls, max_response_tokens=self.solver_max_response_tokens,
                           max_observation_tokens=self.max_observation_tokens, topk=self.topk, finish_tag=P.ANSWER_CLOSE)

    def scoring_agent(self) -> AgentConfig:
        """The scoring agent config, built as ``ScoreModule.score_reports`` builds it."""
        return AgentConfig(max_tool_calls=self.evaluator_max_tool_calls,
                           max_response_tokens=self.evaluator_max_response_tokens,
                           max_observation_tokens=self.max_observation_tokens, topk=self.topk,
                           finish_tag=P.EVALS_CLOSE, allow_search=self.evaluator_max_tool_calls > 0)


# ---------------------------------------------------------------------------- token helpers
def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Prompt ids exactly as ``ScoreModule._chat_ids`` builds them (chat template + generation prompt)."""
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
    return list(ids)


def _enc(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def truncate_text(tokenizer, text: str, max_tokens: int) -> str:
    """As ``ScoreModule._truncate_text``: a report cut to ``max_tokens`` tokens inside the scoring prompt."""
    ids = _enc(tokenizer, text)
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


class _ScriptEngine:
    """A :class:`RolloutEngine` that "generates" pre-written turns, honouring stops and budgets.

    Each call pops the next turn of the (single) trajectory being scripted; the text is tokenised
    on its own, cut after the first stop id and at ``max_new_tokens``, as a sampler would be.
    """

    def __init__(self, tokenizer, turns: Sequence[str]):
        self.tok = tokenizer
        self.turns = list(turns)

    def generate(self, prompts, params: SamplingParams) -> list[Generation]:
        out = []
        for _ in prompts:
            text = self.turns.pop(0) if self.turns else P.IM_END
            ids = _enc(self.tok, text)
            finish = "length"
            for j, t in enumerate(ids):
                if t in params.stop_token_ids or t == self.tok.eos_token_id:
                    ids, finish = ids[: j + 1], "stop"
                    break
            else:
                if params.stop_strings and any(self.tok.decode(ids).endswith(s) for s in params.stop_strings):
                    finish = "stop"
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
            out.append(Generation(ids, None, finish))
        return out

    def sync_weights(self, named_tensors) -> None:  # pragma: no cover - protocol only
        return None


class _CachedRetriever:
    """Memoises a retriever's answers per (query, topk): demos search the same strings many times."""

    def __init__(self, inner: Retriever):
        self.inner = inner
        self.cache: dict[tuple[str, int], list[SearchHit]] = {}

    def search(self, queries: list[str], topk: int) -> list[list[SearchHit]]:
        missing = [q for q in dict.fromkeys(queries) if (q, topk) not in self.cache]
        if missing:
            for q, hits in zip(missing, self.inner.search(missing, topk)):
                self.cache[(q, topk)] = list(hits)
        return [list(self.cache[(q, topk)]) for q in queries]


# ---------------------------------------------------------------------------- text helpers
_DOTTED_RE = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STOP = frozenset(
    """a an the and or of for to in on with without by from as at is are be been was were do does did how
    what which when where why who whom should would could can may might must will shall it its this that these
    those each every any all both either between versus vs than then there their they them you your we our
    explain compare describe cover given also not no yes into over under about plain new use used using
    differ difference differences work works working when what's does help helps make makes
    """.split()
)
_SENT_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")


def _clean(text: str) -> str:
    """Passage text made safe inside an answer: no brackets (not a citation), no angle tags, one line."""
    text = text.replace("[", "(").replace("]", ")").replace("<", "").replace(">", "")
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"\s+", " ", text).strip()


def _words_cap(text: str, n: int) -> str:
    words = text.split()
    return text if len(words) <= n else " ".join(words[:n])


def query_entities(query: str, known_ids: frozenset[str] = frozenset()) -> list[str]:
    """Names the question is about: dotted names, snake/CamelCase identifiers, known module ids."""
    out: list[str] = []
    for m in _DOTTED_RE.findall(query):
        out.append(m.rstrip("."))
    for w in _WORD_RE.findall(query):
        if any(w in o.split(".") for o in out):
            continue
        is_ident = "_" in w.strip("_") or (any(c.isupper() for c in w[1:]) and any(c.islower() for c in w))
        if is_ident or (w in known_ids and w.lower() not in _STOP and len(w) > 2):
            out.append(w)
    return list(dict.fromkeys(out))


def query_keywords(query: str) -> list[str]:
    """Content words of the question, in order, without stopwords and duplicates."""
    words = [w for w in _WORD_RE.findall(query.replace(".", " ")) if w.lower() not in _STOP and len(w) > 2]
    return list(dict.fromkeys(words))


def search_queries(rng: random.Random, query: str, n: int, known_ids: frozenset[str]) -> list[str]:
    """``n`` distinct search strings derived from the question (names, name + keyword, keywords)."""
    ents = query_entities(query, known_ids)
    kws = [k for k in query_keywords(query) if not any(k in e for e in ents)]
    cands: list[str] = []
    order = ents[:]
    rng.shuffle(order)
    for e in order:
        r = rng.random()
        if r < 0.6 or not kws:
            cands.append(e)
        else:
            cands.append(f"{e} {rng.choice(kws)}")
    if kws:
        for _ in range(2):
            k = min(len(kws), rng.randint(2, 3))
            start = rng.randrange(0, max(1, len(kws) - k + 1))
            cands.append(" ".join(kws[start : start + k]))
    cands = list(dict.fromkeys(c for c in cands if c.strip()))
    # names first (more specific), keyword phrases fill in; keep some randomness in which names
    return cands[:n] if len(cands) >= n else cands


def first_sentence(text: str, max_words: int = 10) -> str:
    """A readable leading sentence of a passage (skipping code-like lines), cleaned and capped."""
    for s in _SENT_SPLIT_RE.split(text):
        s = _clean(s)
        letters = sum(c.isalpha() for c in s)
        if len(s.split()) >= 3 and letters >= 0.6 * max(len(s), 1) and "import " not in s and ">>>" not in s:
            s = _words_cap(s, max_words).rstrip(" .,:;")
            return s[0].upper() + s[1:] + "."
    return ""


# ---------------------------------------------------------------------------- harness states and rubrics
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


# ---------------------------------------------------------------------------- solver answers
@dataclass
class _Evidence:
    doc_id: str
    sentence: str


def _visible_evidence(tokenizer, hits: list[SearchHit], budget: int) -> list[_Evidence]:
    """Hits whose ``[id]`` survives the observation's token budget, with a usable sentence."""
    ids, _ = format_observation(hits, budget, tokenizer)
    shown = tokenizer.decode(ids)
    out = []
    for h in hits:
        if f"[{h.id}]" not in shown:
            continue
        s = first_sentence(h.text) or f"{h.title or h.id} is documented in the standard library."
        out.append(_Evidence(h.id, s))
    return out


def _lower_first(s: str) -> str:
    return s[:1].lower() + s[1:] if s[:1].isupper() and not s[1:2].isupper() else s


def build_answer(
    rng: random.Random, query: str, evidence: list[_Evidence], rubric: Rubric | None, known_ids: frozenset[str],
    max_claims: int = 3,
) -> str:
    """An answer citing ``evidence`` ids, in one of several structures, ending with ``Conclusion: ...``."""
    ents = query_entities(query, known_ids) or query_keywords(query)[:2] or ["the question"]
    ev = evidence[:max_claims]
    dims = set(rubric.dims) if rubric else set()
    style = rng.choice(("plain", "bullets", "according", "intro"))
    lines: list[str] = []
    if style == "intro" and len(ents) >= 2:
        lines.append(f"The question compares {ents[0]} with {ents[1]}.")
    elif style == "intro":
        lines.append(f"The question is about {ents[0]}.")
    claims = []
    for e in ev:
        s = e.sentence.rstrip(".")
        if style == "bullets":
            claims.append(f"- {e.doc_id}: {s} [{e.doc_id}].")
        elif style == "according":
            claims.append(f"According to [{e.doc_id}], {_lower_first(s)}.")
        else:
            claims.append(f"{s} [{e.doc_id}].")
    lines.append(("\n" if style == "bullets" else " ").join(claims))
    if "practical_guidance" in dims and rng.random() < 0.7:
        lines.append(f"In practice, start with {ents[0]} and check its documentation.")
    if "uncertainty_calibration" in dims and rng.random() < 0.7:
        missing = [e for e in ents if not any(e in x.doc_id for x in ev)]
        if missing:
            lines.append(f"The retrieved passages say little about {missing[0]}.")
    main = ev[0].doc_id if ev else ents[0]
    concl = rng.choice((
        f"Conclusion: {main} is the most relevant choice here.",
        f"Conclusion: use {main} for this task.",
        f"Conclusion: {_lower_first(ev[0].sentence) if ev else 'the evidence is limited.'}",
        f"Conclusion: prefer {main}, as the cited documentation shows.",
    ))
    body = ("\n" if style == "bullets" else " ").join(x for x in lines if x)
    return f"{body}\n{concl}"


_SOLVER_THINK = (
    "{t}The question is about {e}. I will search for {q}.{c}",
    "{t}Key terms: {e}. Start with {q}.{c}",
    "{t}I need evidence on {e}.{c}",
    "{t}Search the documentation for {q}.{c}",
)


def _think_first(rng: random.Random, ents: list[str], q: str) -> str:
    e = " and ".join(ents[:2]) if ents else q
    return rng.choice(_SOLVER_THINK).format(t=P.THINK_OPEN, c=P.THINK_CLOSE, e=e, q=q)


# ---------------------------------------------------------------------------- builder
class DemoBuilder:
    """Builds the three demo kinds for one tokenizer, retriever, query set and budget."""

    def __init__(self, tokenizer, retriever: Retriever, queries: Sequence[str], budgets: DemoBudgets,
                 base_state: HarnessState | None = None, seed: int = 0):
        self.tok = tokenizer
        self.retriever = _CachedRetriever(retriever)
        self.queries = [q for q in queries if q.strip()]
        if not self.queries:
            raise ValueError("sft demos: no queries")
        self.b = budgets
        self.base = base_state if base_state is not None else HarnessState()
        self.seed = int(seed)
        docs = getattr(retriever, "docs", None) or []
        self.known_ids = frozenset(d.id for d in docs)
        self.eos = tokenizer.eos_token_id
        self.stats = DemoStats()

    # ------------------------------------------------------------------ solver
    def _solver_plan(self, rng: random.Random, query: str, n_search: int) -> tuple[list[str], list[list[SearchHit]]]:
        qs = search_queries(rng, query, n_search, self.known_ids)
        if not qs:
            qs = [" ".join(query.split()[:4])]
        hits = self.retriever.search(qs, self.b.topk)
        return qs, hits

    def _answer_for(self, rng: random.Random, query: str, qs, hits, rubric: Rubric | None, max_claims: int) -> tuple[str, list[str]]:
        ev: list[_Evidence] = []
        for hs in hits:
            for e in _visible_evidence(self.tok, hs, self.b.max_observation_tokens):
                if all(e.doc_id != x.doc_id for x in ev):
                    ev.append(e)
        rng.shuffle(ev) if rng.random() < 0.3 else None
        if not ev:
            return "", []
        answer = build_answer(rng, query, ev, rubric, self.known_ids, max_claims=max_claims)
        return answer, [e.doc_id for e in ev]

    def solver_group(self, rng: random.Random, query: str, n: int) -> list[Demo]:
        """``n`` trajectories for one solver prompt (one harness state and rubric), like RL's K rollouts."""
        b = self.b
        state = random_state(rng, self.base, b.evaluator_max_tool_calls)
        rubric = fallback_rubric(state) if rng.random() < 0.4 else random_rubric(rng, state)
        prompt = chat_ids(self.tok, solver_messages(query, rubric, state, b.solver_max_tool_calls))
        if len(prompt) > b.max_prompt_tokens:
            return []
        out = []
        for _ in range(n):
            d = self._solver_response(random.Random(rng.random()), query, state, rubric, prompt)
            if d is not None:
                out.append(d)
        return out

    def _solver_response(self, rng: random.Random, query: str, state: HarnessState, rubric: Rubric,
                         prompt: list[int]) -> Demo | None:
        b = self.b
        n_search = min(rng.choices([1, 2, 3, 4], weights=[0.4, 0.38, 0.17, 0.05])[0], max(1, b.solver_max_tool_calls))
        if b.solver_max_tool_calls == 0:
            n_search = 0
        ents = query_entities(query, self.known_ids)
        for attempt in range(6):
            n = max(0 if b.solver_max_tool_calls == 0 else 1, n_search - attempt // 2)
            max_claims = max(1, 2 - (1 if attempt >= 3 else 0) - (0 if rng.random() < 0.6 else 1))
            sub = random.Random(rng.random())
            qs, hits = self._solver_plan(sub, query, n) if n else ([], [])
            answer, _ = self._answer_for(sub, query, qs, hits, rubric, max_claims)
            if not answer:
                continue
            turns = []
            for i, q in enumerate(qs):
                if i == 0:
                    pre = _think_first(sub, ents, q) if sub.random() < 0.85 else ""
                else:
                    pre = f"{P.THINK_OPEN}Next: {q}.{P.THINK_CLOSE}" if sub.random() < 0.5 else ""
                turns.append(f"{pre}{P.SEARCH_OPEN}{q}{P.SEARCH_CLOSE}")
            pre = f"{P.THINK_OPEN}Enough evidence to answer.{P.THINK_CLOSE}" if sub.random() < 0.35 else ""
            turns.append(f"{pre}{P.ANSWER_OPEN}{answer}{P.ANSWER_CLOSE}")
            traj = run_agent(_ScriptEngine(self.tok, turns), self.tok, [prompt], self.retriever, b.solver_agent())[0]
            if not traj.finished or traj.truncated or len(traj.response_ids) + 1 > b.solver_max_response_tokens:
                continue
            if traj.search_queries != qs:
                continue
            return Demo(SOLVER, prompt, traj.response_ids + [self.eos], traj.response_mask + [1], meta={
                "query": query, "search_queries": list(qs), "retrieved_ids": list(traj.retrieved_ids),
                "answer": answer, "tool_calls": traj.tool_calls, "state": state.to_dict(),
                "rubric": [list(rubric.dims), list(rubric.weights)],
            })
        return None

    # ------------------------------------------------------------------ rubric
    def rubric_group(self, rng: random.Random, n: int) -> list[Demo]:
        """``n`` different valid rubrics for one rubric prompt (state, queries, scheduler hints)."""
        b = self.b
        state = random_state(rng, self.base, b.evaluator_max_tool_calls)
        n_q = rng.choices([1, 2, 3], weights=[0.25, 0.6, 0.15])[0]
        queries = rng.sample(self.queries, min(n_q, len(self.queries)))
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
        prompt = chat_ids(self.tok, rubric_messages(queries, state, required, avoided, explore))
        if len(prompt) > b.max_prompt_tokens:
            return []
        out = []
        for _ in range(n):
            for think in (rng.random() < 0.9, False):
                rubric = random_rubric(rng, state, required, avoided, explore)
                text = rubric_response(rubric, state.dimension_constraints.k, think)
                ids = _enc(self.tok, text)
                if len(ids) <= b.max_rubric_tokens:
                    out.append(Demo(RUBRIC, prompt, ids, [1] * len(ids), meta={
                        "state": state.to_dict(), "rubric": [list(rubric.dims), list(rubric.weights)],
                        "queries": queries, "hints": [required, avoided, explore],
                    }))
                    break
        return out

    # ------------------------------------------------------------------ scoring
    def _report(self, rng: random.Random, query: str, rubric: Rubric, kind: str) -> tuple[str, dict]:
        """One report of a given quality ``kind`` and the features its scores depend on."""
        if kind == "empty":
            return "(no report)", {"kind": kind, "cited": []}
        if kind == "off_topic":
            other = rng.choice([q for q in self.queries if q != query] or [query])
            qs, hits = self._solver_plan(rng, other, rng.randint(1, 2))
            text, _ = self._answer_for(rng, other, qs, hits, rubric, 2)
            return text or "(no report)", {"kind": kind, "cited": list(dict.fromkeys(re.findall(r"\[([^\]\s]+)\]", text)))}
        qs, hits = self._solver_plan(rng, query, rng.randint(1, 3))
        text, _ = self._answer_for(rng, query, qs, hits, rubric, 3 if kind != "partial" else 1)
        if not text:
            return "(no report)", {"kind": "empty", "cited": []}
        if kind == "no_citation":
            text = re.sub(r"\s*\[[^\]\s]+\]", "", text).replace("According to ,", "According to the docs,")
        elif kind == "fake_citation":
            cited = re.findall(r"\[([^\]\s]+)\]", text)
            if cited:
                fake = cited[0].rsplit(".", 1)[0] + "." + rng.choice(("helper", "fast_path", "legacy", "internal"))
                text = text.replace(f"[{cited[0]}]", f"[{fake}]")
        elif kind == "truncated":
            text = text.split("\nConclusion:")[0]
            words = text.split(" ")
            text = " ".join(words[: max(4, len(words) // 2)])
        cited = list(dict.fromkeys(re.findall(r"\[([^\]\s]+)\]", text)))
        return text, {"kind": kind, "cited": cited}

    _BASE = {"good": 8, "partial": 6, "no_citation": 4, "fake_citation": 4, "truncated": 4, "off_topic": 2, "empty": 0}

    def _scores(self, rng: random.Random, feat: dict, rubric: Rubric, confirmed: set[str]) -> list[int]:
        kind = feat["kind"]
        base = self._BASE[kind]
        out = []
        for d in rubric.dims:
            if kind == "empty":
                out.append(0)
                continue
            v = base + rng.choice((-1, 0, 0, 1))
            if d in ("citation_grounding", "factual_support"):
                if kind in ("no_citation", "fake_citation"):
                    v -= 2
                elif any(c in confirmed for c in feat["cited"]):
                    v += 1
            if d in ("comprehensiveness", "evidence_coverage") and kind in ("partial", "truncated"):
                v -= 1
            if d == "conciseness" and kind in ("partial",):
                v += 1
            out.append(int(min(10, max(0, v))))
        return out

    @staticmethod
    def _reason(v: int) -> str:
        """A one-word reason (the parser ignores it; short keeps K x k scores inside the budget)."""
        if v == 0:
            return "missing"
        return "strong" if v >= 8 else "good" if v >= 6 else "weak" if v >= 4 else "poor"

    def _verification(self, feat: dict, confirmed: set[str]) -> str:
        kind, cited = feat["kind"], feat["cited"]
        if kind == "empty":
            return "No report."
        if kind == "off_topic":
            return "Off-topic."
        if not cited:
            return "No citations."
        c = cited[0]
        if c in confirmed:
            return f"[{c}] found by search."
        if c not in self.known_ids and self.known_ids:
            return f"[{c}] not found."
        return f"[{c}] not re-checked."

    def _gap(self, query: str, text: str, feat: dict) -> str:
        kind = feat["kind"]
        if kind == "empty":
            return "Everything."
        if kind == "off_topic":
            return "Does not answer the question."
        if kind == "truncated":
            return "No conclusion."
        missing = [e for e in query_entities(query, self.known_ids) if e not in text]
        if missing:
            return f"Misses {missing[0]}."
        return "None."

    def scoring_group(self, rng: random.Random, query: str, n: int) -> list[Demo]:
        """``n`` evaluations of one scoring prompt (K reports of mixed quality)."""
        b = self.b
        state = random_state(rng, self.base, b.evaluator_max_tool_calls)
        rubric = fallback_rubric(state) if rng.random() < 0.3 else random_rubric(rng, state)
        K = b.num_rollouts if rng.random() < 0.75 else rng.randint(2, max(3, b.num_rollouts + 1))
        kinds = rng.choices(list(self._BASE), weights=[0.4, 0.15, 0.1, 0.1, 0.1, 0.1, 0.05], k=K)
        reports, feats = [], []
        for kind in kinds:
            text, feat = self._report(random.Random(rng.random()), query, rubric, kind)
            reports.append(truncate_text(self.tok, text, b.max_report_tokens))
            feats.append(feat)
        prompt = chat_ids(self.tok, scoring_messages(query, reports, rubric, state))
        if len(prompt) > b.max_prompt_tokens:
            return []
        out = []
        for _ in range(n):
            d = self._scoring_response(random.Random(rng.random()), query, state, rubric, reports, feats, prompt)
            if d is not None:
                out.append(d)
        return out

    def _scoring_response(self, rng: random.Random, query: str, state: HarnessState, rubric: Rubric,
                          reports: list[str], feats: list[dict], prompt: list[int]) -> Demo | None:
        b = self.b
        K = len(reports)
        pc = state.process_constraints
        # verification searches: at least the harness minimum and >= 1 (the reward verifier needs depth)
        n_min = max(1, pc.min_number_of_tool_call) if b.evaluator_max_tool_calls > 0 else 0
        n_search = min(b.evaluator_max_tool_calls, max(n_min, rng.choice((1, 1, 2))))
        cited_all = [c for f in feats for c in f["cited"] if f["kind"] != "off_topic"]
        for attempt in range(3):
            sub = random.Random(rng.random())
            qs: list[str] = []
            if n_search:
                if cited_all and sub.random() < 0.5:
                    qs.append(sub.choice(cited_all))
                for q in search_queries(sub, query, n_search, self.known_ids):
                    if len(qs) < n_search and q not in qs:
                        qs.append(q)
            hits = self.retriever.search(qs, b.topk) if qs else []
            confirmed = {e.doc_id for hs in hits for e in _visible_evidence(self.tok, hs, b.max_observation_tokens)}
            short = attempt >= 1
            blocks = []
            for i, (text, feat) in enumerate(zip(reports, feats), 1):
                scores = self._scores(sub, feat, rubric, confirmed)
                parts = [f'<report id="{i}">']
                if pc.require_verification or not short:
                    parts.append(f"{P.VERIFICATION_OPEN}{self._verification(feat, confirmed)}{P.VERIFICATION_CLOSE}")
                if pc.require_gap_analysis or not short:
                    parts.append(f"{P.GAP_OPEN}{self._gap(query, text, feat)}{P.GAP_CLOSE}")
                sc = "".join(
                    f'<score dim="{d}" value="{v}"' + ("" if attempt >= 2 else f' reason="{self._reason(v)}"') + "/>"
                    for d, v in zip(rubric.dims, scores)
                )
                parts.append(f"{P.SCORES_OPEN}{sc}{P.SCORES_CLOSE}{P.REPORT_CLOSE}")
                blocks.append("".join(parts))
            evals = f"{P.EVALS_OPEN}" + "\n".join(blocks) + f"{P.EVALS_CLOSE}"
            turns = []
            for j, q in enumerate(qs):
                pre = f"{P.THINK_OPEN}Check the reports' claims.{P.THINK_CLOSE}" if j == 0 and sub.random() < 0.5 else ""
                turns.append(f"{pre}{P.SEARCH_OPEN}{q}{P.SEARCH_CLOSE}")
            turns.append(evals)
            traj = run_agent(_ScriptEngine(self.tok, turns), self.tok, [prompt], self.retriever, b.scoring_agent())[0]
            if not traj.finished or traj.truncated or len(traj.response_ids) + 1 > b.evaluator_max_response_tokens:
                continue
            return Demo(SCORING, prompt, traj.response_ids + [self.eos], traj.response_mask + [1], meta={
                "query": query, "num_reports": K, "state": state.to_dict(),
                "rubric": [list(rubric.dims), list(rubric.weights)], "kinds": [f["kind"] for f in feats],
                "search_queries": list(qs), "tool_calls": traj.tool_calls,
            })
        return None

    # ------------------------------------------------------------------ all
    def build(self, n_solver: int, n_rubric: int, n_scoring: int,
              per_prompt: dict[str, int] | None = None) -> list[Demo]:
        """About ``n_*`` demos per kind, in groups of ``per_prompt[kind]`` responses sharing one prompt.

        Deterministic given the seed; a kind's demos do not depend on the other kinds' counts. The
        ``group`` field numbers the prompts (the trainer runs each prompt once for its whole group).
        """
        per = {SOLVER: 1, RUBRIC: 1, SCORING: 1, **(per_prompt or {})}
        demos: list[Demo] = []
        group = 0
        for kind, n in ((SOLVER, n_solver), (RUBRIC, n_rubric), (SCORING, n_scoring)):
            rng = random.Random(f"{self.seed}-{kind}-{DEMO_VERSION}")
            size = max(1, int(per[kind]))
            n_prompts = -(-n // size) if n > 0 else 0
            got = tries = 0
            while got < n_prompts and tries < 3 * n_prompts + 10:
                tries += 1
                sub = random.Random(rng.random())
                query = self.queries[(tries - 1) % len(self.queries)] if sub.random() < 0.5 else sub.choice(self.queries)
                if kind == SOLVER:
                    ds = self.solver_group(sub, query, size)
                elif kind == RUBRIC:
                    ds = self.rubric_group(sub, size)
                else:
                    ds = self.scoring_group(sub, query, size)
                self.stats.dropped[kind] += size - len(ds)
                if not ds:
                    continue
                for d in ds:
                    d.group = group
                demos.extend(ds)
                group += 1
                got += 1
                self.stats.built[kind] += len(ds)
            if got < n_prompts:
                log.warning("sft demos: built %d/%d %s prompts (the rest did not fit the budgets)", got, n_prompts, kind)
        return demos


def build_demos(tokenizer, retriever: Retriever, queries: Sequence[str], budgets: DemoBudgets,
                n_solver: int, n_rubric: int, n_scoring: int, seed: int = 0,
                base_state: HarnessState | None = None,
                per_prompt: dict[str, int] | None = None) -> tuple[list[Demo], DemoStats]:
    """Build all demonstrations; returns them (solver, then rubric, then scoring) and the counts."""
    builder = DemoBuilder(tokenizer, retriever, queries, budgets, base_state, seed)
    demos = builder.build(n_solver, n_rubric, n_scoring, per_prompt)
    return demos, builder.stats


def demo_summary(demos: Sequence[Demo]) -> dict[str, float]:
    """Counts and mean lengths per kind, for logs and the cache's metadata."""
    out: dict[str, float] = {}
    for kind in (SOLVER, RUBRIC, SCORING):
        ds = [d for d in demos if d.kind == kind]
        out[f"{kind}/count"] = float(len(ds))
        if ds:
            out[f"{kind}/prompt_len_mean"] = sum(len(d.prompt_ids) for d in ds) / len(ds)
            out[f"{kind}/response_len_mean"] = sum(len(d.response_ids) for d in ds) / len(ds)
            out[f"{kind}/response_len_max"] = float(max(len(d.response_ids) for d in ds))
            out[f"{kind}/trained_tokens_mean"] = sum(sum(d.response_mask) for d in ds) / len(ds)
            if kind != RUBRIC:
                out[f"{kind}/tool_calls_mean"] = sum(d.meta.get("tool_calls", 0) for d in ds) / len(ds)
    return out


__all__ = [
    "DEMO_VERSION", "Demo", "DemoBudgets", "DemoBuilder", "DemoStats", "build_demos", "chat_ids", "demo_summary",
    "query_entities", "random_rubric", "random_state", "search_queries", "weight_plans",
]
