"""The solver's and the evaluator's keys, the verifier, the reward, and the lengths arithmetic alone refuses."""

from __future__ import annotations

from score_lightning.launch.config_validation.topology import data_parallel_size
from score_lightning.rollout.modes import evaluator_on_vllm
from score_lightning.launch.config_validation.values import Checks, integer


def check_solver(c: Checks) -> None:
    c("solver.max_tool_calls", integer(0, 10), "an integer in [0, 10]")
    if c.get("solver.freeze") is True and c.get("actor.shared") is True and c.get("evaluator.enabled") is True:
        c.add("solver.freeze=true: with actor.shared=true the evaluator's REINFORCE update moves the shared "
              "weights, so the solver would not be frozen; set actor.shared=false (frozen solver, trained "
              "evaluator) or evaluator.enabled=false (nothing trains)")
    check_solver_workflow(c)
    check_dynamic_sampling(c)


def check_dynamic_sampling(c: Checks) -> None:
    """``solver.dynamic_sampling``: its values, and the rubric sources whose rubric every draw can reuse."""
    target = str(c.get("rubric._target_"))
    if c.get("solver.dynamic_sampling.enabled") is True and not target.endswith("ScoreRubrics"):
        c.add(f"solver.dynamic_sampling.enabled=true with rubric={target.rsplit('.', 1)[-1]}: extra draws reuse the "
              "step's one rubric, and this source writes a rubric per query; use rubric=score or disable it")


def check_evaluator(c: Checks) -> None:
    if c.get("evaluator.optimizer") == "shared" and c.get("actor.shared") is False:
        c.add("evaluator.optimizer='shared' with actor.shared=false: a separate evaluator model always has its own "
              "optimiser; use evaluator.optimizer=own")
    check_score_readout(c)
    check_scoring_reward(c)
    check_lengths(c)


def check_score_readout(c: Checks) -> None:
    """``evaluator.score_readout``: ``expected`` only where a decoder reads the value distribution (the HF engine's
    grammar fast-forward, on a module that is not sharded), i.e. under constrained scoring."""
    if c.get("evaluator.score_readout") != "expected":
        return
    why = []
    if c.get("evaluator.constrained_scoring") is not True:
        why.append("evaluator.constrained_scoring=true (the grammar marks where a value starts)")
    engine = c.get("rollout.engine")
    if engine == "scripted":
        why.append("an HF engine, not rollout=scripted (a script writes its values)")
    if evaluator_on_vllm(c.cfg.rollout, c.cfg.actor):
        why.append("an HF scoring engine, not vLLM (its logprobs are the sampled tokens' top-k, not the masked "
                   "value distribution; rollout.evaluator_engine=hf or actor.shared=false scores on HF)")
    if (engine in ("hf", "vllm") and not evaluator_on_vllm(c.cfg.rollout, c.cfg.actor)
            and c.get("rollout.grammar_fast_forward") is False):
        why.append("rollout.grammar_fast_forward=true (the fast-forward decoder reads the distribution)")
    if c.get("strategy.name") == "fsdp" and data_parallel_size(c.cfg) > 1:
        why.append("an unsharded evaluator: on a sharded module the HF engine decodes without the fast-forward")
    if why:
        c.add("evaluator.score_readout=expected needs " + "; ".join(why) + "; or use evaluator.score_readout=sampled")


def check_scoring_reward(c: Checks) -> None:
    """``evaluator.scoring_reward``: REINFORCE on the scoring tokens needs scoring the policy samples and trains."""
    if c.get("evaluator.scoring_reward") == "none":
        return
    why = []
    if c.get("evaluator.enabled") is not True:
        why.append("evaluator.enabled=true (the evaluator's update trains them)")
    if c.get("reward.source") == "rule":
        why.append("reward.source=evaluator (the rule reward runs no scoring)")
    if c.get("evaluator.source") == "external":
        why.append("evaluator.source=policy (an external judge's tokens are not the policy's)")
    temp, scoring_temp = c.get("evaluator.temperature"), c.get("evaluator.scoring_temperature")
    if scoring_temp is not None and scoring_temp != temp:
        why.append(f"evaluator.scoring_temperature=null or {temp} (REINFORCE reads the log-probs at "
                   f"evaluator.temperature; scoring sampled at {scoring_temp} is another policy's sample)")
    if why:
        c.add("evaluator.scoring_reward=pairwise_recall needs " + "; ".join(why) + "; or evaluator.scoring_reward=none")


def check_reward(c: Checks) -> None:
    depth, calls = c.get("verifier.min_search_depth"), c.get("evaluator.max_tool_calls")
    if c.get("verifier.enabled") is True and isinstance(depth, int) and isinstance(calls, int) and depth > calls:
        c.add(f"verifier.min_search_depth={depth}: more searches than evaluator.max_tool_calls={calls} allows, so "
              "the verifier would zero every reward; lower it, raise evaluator.max_tool_calls, or "
              "verifier.enabled=false")
    if c.get("reward.source") == "rule":
        if c.get("verifier.enabled") is True:
            c.add("reward.source=rule with verifier.enabled=true: the verifier checks the evaluation's searches, and "
                  "with the rule reward no evaluation runs; set verifier.enabled=false (experiment=rule_tiny does)")
        if c.get("evaluator.enabled") is True and c.get("evaluator.reward") in ("discriminative", "preference"):
            c.add(f"reward.source=rule with evaluator.reward={c.get('evaluator.reward')}: that reward reads the "
                  "evaluator's scores, which the rule reward never asks for; use evaluator.reward=consistency or "
                  "evaluator.enabled=false")


def check_solver_workflow(c: Checks) -> None:
    """``solver.agent`` and ``reward.step`` together, and MaMs' budgets (the names themselves are the schema's)."""
    if c.get("reward.step") == "stage" and c.get("solver.agent") != "rubricem":
        c.add(f"reward.step=stage with solver.agent={c.get('solver.agent')!r}: stage credit reads the plan, research, "
              "review and answer stages only solver.agent=rubricem writes")
    if c.get("solver.rubricem.reflection") is True and (c.get("reward.step") != "stage"
                                                         or c.get("rollout.mode") == "async"):
        c.add("solver.rubricem.reflection=true needs reward.step=stage (the stage judgements it distils) and "
              "rollout.mode=sync (the memory lives in the trainer; a rollout worker would not see it)")
    if c.get("solver.agent") != "mams":
        return
    c("solver.max_tool_calls", integer(1, 10), "an integer in [1, 10] with solver.agent=mams (a search role call per "
      "turn)")
    m = c.cfg.solver.mams
    parts = [m.chunk_tokens, m.memory_tokens, m.plan_tokens, m.report_tokens]
    limit = m.max_context_tokens
    if all(isinstance(v, int) for v in parts + [limit]) and sum(parts) >= limit:
        c.add(f"solver.mams.max_context_tokens={limit}: must exceed chunk + memory + plan + report tokens "
              f"({sum(parts)}), which a role prompt may hold besides the question and instructions")


def check_lengths(c: Checks) -> None:
    """What arithmetic alone refuses; the tokenizer-measured checks are :func:`score_lightning.launch.budgets.check_budgets`."""
    n = 1 if c.get("evaluator.scoring") == "pointwise" else c.get("solver.num_rollouts")
    report, cap = c.get("evaluator.max_report_tokens"), c.get("evaluator.max_prompt_tokens")
    if all(isinstance(v, int) for v in (n, report, cap)) and n * report >= cap:
        c.add(f"evaluator.max_prompt_tokens={cap}: {n} reports x evaluator.max_report_tokens={report} = "
              f"{n * report} tokens leave no room for the query, rubric and instructions of the scoring "
              "prompt; raise evaluator.max_prompt_tokens or lower evaluator.max_report_tokens")
    if c.get("rollout.engine") != "vllm":
        return
    max_len = c.get("rollout.max_model_len")  # rollout=vllm's key
    if not isinstance(max_len, int):
        return
    solver = (c.get("solver.max_prompt_tokens"), c.get("solver.max_response_tokens"))
    scoring = (cap, c.get("evaluator.max_response_tokens"), c.get("evaluator.max_tool_calls"),
               c.get("evaluator.max_observation_tokens"))
    if all(isinstance(v, int) for v in solver) and sum(solver) > max_len:
        c.add(f"rollout.max_model_len={max_len}: shorter than solver.max_prompt_tokens + "
              f"solver.max_response_tokens = {sum(solver)}")
    grows = scoring[0] + scoring[1] + scoring[2] * scoring[3] if all(isinstance(v, int) for v in scoring) else 0
    if evaluator_on_vllm(c.cfg.rollout, c.cfg.actor) and grows > max_len:  # an evaluator on HF never reaches vLLM's context
        c.add(f"rollout.max_model_len={max_len}: shorter than an evaluation can grow: evaluator.max_prompt_tokens"
              f" + evaluator.max_response_tokens + evaluator.max_tool_calls x evaluator.max_observation_tokens "
              f"= {scoring[0] + scoring[1] + scoring[2] * scoring[3]} (observations are outside the "
              "evaluator's generation budget)")
