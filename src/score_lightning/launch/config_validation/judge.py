"""``evaluator.source``, the ``judge`` group and the citation reward through it (``reward.citation_judge``)."""

from __future__ import annotations

from score_lightning.launch.config_validation.topology import data_parallel_size
from score_lightning.launch.config_validation.values import Checks


def check_judge(c: Checks) -> None:
    external = c.get("evaluator.source") == "external"
    citation = c.get("reward.citation_judge.enabled") is True
    if not (external or citation):
        return
    c("judge.base_url", lambda v: isinstance(v, str) and v.startswith(("http://", "https://")),
      "an http(s):// URL of an OpenAI-compatible API (e.g. http://127.0.0.1:8001/v1)")
    c("judge.model", lambda v: isinstance(v, str) and bool(v.strip()), "the model name the endpoint serves")
    check_shares(c)
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


def calling_processes(c: Checks) -> tuple[int, str]:
    """The processes that make external chat calls, as ``clients/limiter.configure_limits`` counts them at run
    time: every training process (devices x nodes, tensor-parallel ranks included), then the async rollout worker."""
    training = data_parallel_size(c.cfg)
    if c.get("strategy.name") == "fsdp":  # strategy=fsdp's key (ddp runs no tensor parallelism)
        training *= int(c.get("strategy.tensor_parallel_size"))
    worker = c.get("rollout.mode") == "async"
    return training + int(worker), f"{training} training process{'es' if training > 1 else ''}" + (
        " and the async rollout worker" if worker else "")


def check_shares(c: Checks) -> None:
    """``judge.max_concurrency`` and ``judge.requests_per_minute`` are the run's, split among the processes that make
    calls: a limit below their number would leave one with no share (it would get 1 and the run would exceed it)."""
    processes, who = calling_processes(c)
    for key in ("judge.max_concurrency", "judge.requests_per_minute"):
        value = c.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < processes:
            c.add(f"{key}={value} is the whole run's limit, split among the {processes} processes that make external "
                  f"chat calls ({who}), and each needs a share of at least 1: set {key} >= {processes}")
