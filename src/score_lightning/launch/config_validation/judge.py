"""``evaluator.source``, the ``judge`` group and the citation reward through it (``reward.citation_judge``)."""

from __future__ import annotations

from score_lightning.launch.config_validation.values import BOOL, Checks, integer, number, one_of


def check_judge(c: Checks) -> None:
    c("evaluator.source", one_of("policy", "external"),
      "'policy' (the evaluator role scores) or 'external' (an OpenAI-compatible judge scores each report)")
    external = c.get("evaluator.source") == "external"
    citation = c.get("reward.citation_judge.enabled") is True
    if c.get("reward.citation_judge") is not None:
        c("reward.citation_judge.enabled", *BOOL)
        c("reward.citation_judge.weight", number(0.0), "a number >= 0 (the citation term's weight in the reward)")
        c("reward.citation_judge.max_claims", integer(1), "an integer >= 1 (claims of a report sent to the judge)")
        c("reward.citation_judge.max_passage_chars", integer(1), "an integer >= 1")
    if not (external or citation):
        return
    if c.get("judge") is None:
        c.add("evaluator.source=external or reward.citation_judge.enabled=true needs the judge group (judge=default)")
        return
    c("judge.base_url", lambda v: isinstance(v, str) and v.startswith(("http://", "https://")),
      "an http(s):// URL of an OpenAI-compatible API (e.g. http://127.0.0.1:8001/v1)")
    c("judge.model", lambda v: isinstance(v, str) and bool(v.strip()), "the model name the endpoint serves")
    c("judge.max_concurrency", integer(1), "an integer >= 1 (calls in flight, shared by every caller)")
    c("judge.requests_per_minute", integer(0), "an integer >= 0 (0: unlimited)")
    c("judge.timeout_s", number(0.0, lo_open=True), "a number > 0 (seconds: each call's hard deadline)")
    c("judge.max_retries", integer(0, 10), "an integer in [0, 10]")
    c("judge.max_failed_rate", number(0.0, 1.0), "a number in [0, 1] (a step above it stops the run)")
    if not external:
        return
    if c.get("reward.source") == "rule":
        c.add("evaluator.source=external with reward.source=rule: the rule reward asks no evaluator for scores; "
              "use one or the other")
    if c.get("evaluator.scoring") != "pointwise":
        c.add("evaluator.source=external scores each report on its own: set evaluator.scoring=pointwise")
    if c.get("verifier.enabled") is True:
        c.add("evaluator.source=external with verifier.enabled=true: the judge makes no verification searches "
              "(depth 0), so the verifier would zero every reward; set verifier.enabled=false "
              "(experiment=grpo_judge_tiny does)")
    if c.get("evaluator.score_readout") == "expected":
        c.add("evaluator.score_readout=expected reads the policy's own value distribution; an external judge "
              "writes its values: use evaluator.score_readout=sampled")
