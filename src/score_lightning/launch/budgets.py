"""Token budgets checked with the configured tokenizer, before any model loads.

The scoring prompt holds the query, the rubric, the process rules, the harness notes and the reports
(K of them with ``evaluator.scoring: joint``, one with ``pointwise``), each cut to
``evaluator.max_report_tokens`` and, with ``evaluator.show_retrieved``, each with the ids its searches
returned (with ``evaluator.show_passages``, also ``evaluator.max_cited_passages`` passages of
``evaluator.passage_tokens`` tokens each). Whether that fits ``evaluator.max_prompt_tokens`` depends on the
tokenizer and its chat template, so it is measured, not guessed: the prompt is built with the
project's own builder (:func:`~score_lightning.roles.prompts.scoring_messages`) from the longest
training query, the widest rubric the harness allows (its k cap, the pool's longest definitions,
weights printed at full precision), every process rule on, the rule harness's longest note, and
placeholder reports of exactly ``max_report_tokens`` tokens. A run whose scoring prompt could
overflow is refused here instead of raising in ``encode_chat`` hours in.

The rubric prompt (``rubric=score``) must fit the same cap: ``evaluator.rubric_queries`` of the global
batch's queries, each with its initial evidence D_q^0 (``solver.topk`` documents labelled with ~30 tokens).

The evaluator's search observations are outside its generation budget (``evaluator.max_response_tokens``
counts the tokens it writes; each observation is cut to ``evaluator.max_observation_tokens``), so with
``rollout=vllm`` the engine's ``max_model_len`` must hold the prompt cap, the generation budget and
``evaluator.max_tool_calls`` observations: checked here with the observation wrapper measured too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from score_lightning import protocol as P
from score_lightning.errors import ConfigError
from score_lightning.harness.state import HarnessState
from score_lightning.rollout.modes import evaluator_on_vllm
from score_lightning.roles.prompts import scoring_messages
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.chat import truncate_text

if TYPE_CHECKING:
    from score_lightning.config.run_groups import DataConfig
    from score_lightning.config.step_groups import EvaluatorConfig, SolverConfig

#: text the placeholder reports repeat (prose with citations, like a solver's report)
_REPORT_TEXT = ("The documentation describes the behaviour in detail [doc-1], and a second source confirms "
                "the main caveat with an example [doc-2]. ")
#: the tool-budget notice's own cap (rollout.agent appends it after the last allowed search)
_NOTICE_TOKENS = 64


@dataclass(frozen=True)
class ScoringBudget:
    """The measured worst case of one scoring prompt and one evaluator context."""

    reports: int  # reports per scoring prompt (K joint, 1 pointwise)
    prompt_tokens: int  # the whole prompt with every report at max_report_tokens
    overhead_tokens: int  # prompt_tokens minus the reports' own tokens
    observation_tokens: int  # one observation at its cap, wrapper included
    context_tokens: int  # prompt cap + generation budget + every observation and the budget notice


def scoring_reports(evaluator: "EvaluatorConfig", solver: "SolverConfig") -> int:
    """Reports per scoring prompt: K for a joint evaluation, 1 for ``evaluator.scoring: pointwise``."""
    return 1 if str(evaluator.scoring) == "pointwise" else int(solver.num_rollouts)


def widest_state(cfg: DictConfig) -> HarnessState:
    """The configured state with every process rule on and the rule harness's longest note."""
    state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    pc = state.process_constraints
    pc.require_verification = pc.require_gap_analysis = pc.citation_cross_check = True
    pc.min_number_of_tool_call = max(pc.min_number_of_tool_call, int(cfg.evaluator.max_tool_calls))
    from score_lightning.harness.rule_based import RuleBasedHarness

    fired = RuleBasedHarness(base_state=state).update(state, {"verified_rate": 0.0, "consistency": 1.0,
                                                             "reward_std": 0.0, "rubric_valid_rate": 0.0})
    state.notes = max(state.notes, fired.notes, key=len)
    return state


def widest_rubric(cfg: DictConfig, state: HarnessState) -> Rubric:
    """The harness's largest k (its ``max_k`` cap, else the pool), must-include first, then the longest definitions.

    With ``rubric=given`` the file's longest rubric (by characters) instead. ``rubric=evolving`` items are
    model-written text of no fixed length: they are approximated by the pool's dimensions.
    """
    if str(cfg.rubric._target_).endswith("GivenRubrics"):
        from score_lightning.roles.prompts import format_rubric
        from score_lightning.methods.given.rubrics import load_given_rubrics

        r = cfg.rubric
        given = load_given_rubrics(r.path, bool(r.include_explanation), r.max_items)
        if given:
            return max(given.values(), key=lambda rubric: len(format_rubric(rubric, state)))
    pool = state.dimension_pool
    backend = cfg.harness.backend
    k_cap = backend.max_k if "max_k" in backend else None  # an optional argument no harness option's YAML sets
    if k_cap is None and str(backend._target_).endswith("RuleBasedHarness"):
        import inspect

        from score_lightning.harness.rule_based import RuleBasedHarness

        k_cap = inspect.signature(RuleBasedHarness).parameters["max_k"].default
    k = min(len(pool), max(int(k_cap) if k_cap is not None else len(pool), state.dimension_constraints.k))
    must = [d for d in state.dimension_constraints.must_include if d in pool]
    rest = sorted((d for d in pool if d not in must), key=lambda d: (-len(pool[d]), d))
    dims = (must + rest)[:k]
    return Rubric(tuple(dims), tuple(1.0 / 3.0 for _ in dims))  # "0.3333333333333333": the longest weight text


def longest_queries(data: "DataConfig", tokenizer, n: int = 1) -> list[str]:
    """The ``n`` training queries with the most tokens (the embedded queries without ``data.queries_path``)."""
    from score_lightning.data.queries import load_queries

    queries = [q.prompt for q in load_queries(data.queries_path, data.split)]
    lengths = tokenizer(queries, add_special_tokens=False)["input_ids"]
    return [q for q, _ in sorted(zip(queries, lengths), key=lambda x: -len(x[1]))[:n]]


def longest_query(data: "DataConfig", tokenizer) -> str:
    return longest_queries(data, tokenizer, 1)[0]


def measure_rubric_prompt(cfg: DictConfig, tokenizer) -> int:
    """SCORE's rubric prompt at its largest: ``evaluator.rubric_queries`` of the global batch's queries (the
    longest), each with ``solver.topk`` documents labelled with ~30 tokens of prose, scheduler hints of each
    kind, every process rule and the rule harness's longest note."""
    from score_lightning.roles.evidence import EVIDENCE_WORDS, EvidenceDoc
    from score_lightning.roles.prompts import rubric_messages

    n = min(int(cfg.evaluator.rubric_queries), int(cfg.data.batch_size))
    label = " ".join((_REPORT_TEXT.split() * 2)[:EVIDENCE_WORDS]) + " ..."
    evidence = [[EvidenceDoc(f"{q:08d}{d:08d}", label) for d in range(int(cfg.solver.topk))] for q in range(n)]
    state = widest_state(cfg)
    pool = list(state.dimension_pool)
    queries = longest_queries(cfg.data, tokenizer, n)
    return _count(tokenizer, rubric_messages(queries, state, pool[:2], pool[2:4], pool[4:6], evidence=evidence))


def _count(tokenizer, messages: list[dict]) -> int:
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(enc["input_ids"] if hasattr(enc, "keys") else enc)


def measure_scoring(cfg: DictConfig, tokenizer) -> ScoringBudget:
    """The scoring prompt and evaluator context at their largest, in the tokenizer's own tokens."""
    n, per_report = scoring_reports(cfg.evaluator, cfg.solver), int(cfg.evaluator.max_report_tokens)
    state = widest_state(cfg)
    rubric = widest_rubric(cfg, state)
    query = longest_query(cfg.data, tokenizer)
    filler = _REPORT_TEXT * (per_report // 8 + 2)  # more than per_report tokens for any tokenizer
    report = truncate_text(tokenizer, filler, per_report)  # as scoring_rollouts cuts a report
    pointwise = str(cfg.evaluator.scoring) == "pointwise"
    sources = [_retrieved_ids(cfg.solver)] * n if bool(cfg.evaluator.show_retrieved) else None
    # + 1 token per report: a real report's last characters may tokenise differently beside the separator
    cited = [_widest_citations(cfg.evaluator, tokenizer)] * n if bool(cfg.evaluator.show_passages) else None
    prompt = _count(tokenizer, scoring_messages(query, [report] * n, rubric, state, sources, pointwise=pointwise,
                                                cited=cited)) + n
    enc = lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    wrapper = enc("\n") + enc(P.OBS_OPEN) + enc(P.OBS_CLOSE) + enc("\n")
    observation = int(cfg.evaluator.max_observation_tokens) + wrapper
    calls = int(cfg.evaluator.max_tool_calls)
    notice = _NOTICE_TOKENS + wrapper if calls > 0 else 0
    context = int(cfg.evaluator.max_prompt_tokens) + int(cfg.evaluator.max_response_tokens) + calls * observation + notice
    return ScoringBudget(n, prompt, prompt - n * enc(report), observation, context)


def _widest_citations(evaluator: "EvaluatorConfig", tokenizer) -> list:
    """The largest cited-passage block a report can be shown with (``evaluator.show_passages``): the most passages,
    each a 16-character id and a text of ``evaluator.passage_tokens`` tokens."""
    tokens = int(evaluator.passage_tokens)
    text = truncate_text(tokenizer, _REPORT_TEXT * (tokens // 8 + 2), tokens)
    return [(f"{i:016d}", text, True) for i in range(int(evaluator.max_cited_passages))]


def _retrieved_ids(solver: "SolverConfig") -> list[str]:
    """The most ids a report can be shown with (``evaluator.show_retrieved``): every search's top-k, each
    counted as a 16-character id (wiki-18's are <= 8 digits; the stdlib corpus's are dotted names)."""
    return [f"{i:016d}" for i in range(int(solver.max_tool_calls) * int(solver.topk))]


def check_budgets(cfg: DictConfig, tokenizer) -> ScoringBudget:
    """Raise :class:`ConfigError` naming the keys when an evaluator prompt or the evaluator's context cannot fit."""
    b = measure_scoring(cfg, tokenizer)
    cap, e = int(cfg.evaluator.max_prompt_tokens), cfg.evaluator
    errors = []
    # rubric.static (rubric=score's own key): the harness fallback rubric every step, no rubric prompt is built
    if str(cfg.rubric._target_).endswith("ScoreRubrics") and not bool(cfg.rubric.static):
        rubric = measure_rubric_prompt(cfg, tokenizer)
        if rubric > cap:
            errors.append(
                f"evaluator.max_prompt_tokens={cap}: the rubric prompt needs up to {rubric} tokens "
                f"(min(evaluator.rubric_queries={e.rubric_queries}, data.batch_size={cfg.data.batch_size}) queries, "
                f"each with solver.topk={cfg.solver.topk} documents of its initial evidence, measured with this "
                "tokenizer's chat template); raise evaluator.max_prompt_tokens or lower evaluator.rubric_queries")
    if b.prompt_tokens > cap:
        errors.append(
            f"evaluator.max_prompt_tokens={cap}: the scoring prompt needs up to {b.prompt_tokens} tokens "
            f"({b.reports} report{'s' if b.reports > 1 else ''} x evaluator.max_report_tokens={e.max_report_tokens} "
            f"+ {b.overhead_tokens} tokens of query, rubric, rules and template, measured with this tokenizer's "
            "chat template); raise evaluator.max_prompt_tokens or lower evaluator.max_report_tokens")
    max_len = cfg.rollout.max_model_len if evaluator_on_vllm(cfg.rollout, cfg.actor) else None  # rollout=vllm's key
    if max_len is not None and b.context_tokens > int(max_len):
        errors.append(
            f"rollout.max_model_len={max_len}: an evaluation can reach {b.context_tokens} tokens "
            f"(evaluator.max_prompt_tokens={cap} + evaluator.max_response_tokens={e.max_response_tokens} + "
            f"evaluator.max_tool_calls={e.max_tool_calls} observations of {b.observation_tokens} tokens and the "
            "budget notice); raise rollout.max_model_len or lower those")
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
    return b
