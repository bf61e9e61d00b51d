"""The solver's and the evaluator's keys, the verifier, the reward, and the lengths arithmetic alone refuses."""

from __future__ import annotations

from score_lightning.launch.config_validation.topology import data_parallel_size
from score_lightning.rollout.modes import evaluator_on_vllm
from score_lightning.rollout.workflows import SOLVER_WORKFLOWS
from score_lightning.step.objectives import EVALUATOR_REWARDS, STEP_CREDIT
from score_lightning.launch.config_validation.values import BOOL, Checks, integer, number, one_of


def check_solver(c: Checks) -> None:
    c("solver.num_rollouts", integer(2), "an integer >= 2 (GRPO normalises over the K rollouts of a query)")
    c("solver.max_tool_calls", integer(0, 10), "an integer in [0, 10]")
    c("solver.max_response_tokens", integer(8), "an integer >= 8")
    c("solver.max_prompt_tokens", integer(8), "an integer >= 8")
    c("solver.max_observation_tokens", integer(1), "an integer >= 1")
    c("solver.topk", integer(1, 100), "an integer in [1, 100]")
    c("solver.temperature", number(0.0, lo_open=True), "a number > 0 (RL needs sampling)")
    c("solver.top_p", number(0.0, 1.0, lo_open=True), "a number in (0, 1]")
    c("solver.freeze", *BOOL)
    c("solver.conclusion_line", *BOOL)
    c("actor.shared", *BOOL)
    if c.get("solver.freeze") is True and c.get("actor.shared") is True and c.get("evaluator.enabled") is True:
        c.add("solver.freeze=true: with actor.shared=true the evaluator's REINFORCE update moves the shared "
              "weights, so the solver would not be frozen; set actor.shared=false (frozen solver, trained "
              "evaluator) or evaluator.enabled=false (nothing trains)")
    check_solver_workflow(c)
    check_dynamic_sampling(c)


def check_dynamic_sampling(c: Checks) -> None:
    """``solver.dynamic_sampling``: its values, and the rubric sources whose rubric every draw can reuse."""
    if c.get("solver.dynamic_sampling") is None:
        return
    c("solver.dynamic_sampling.enabled", *BOOL)
    c("solver.dynamic_sampling.max_draws", integer(1, 16), "an integer in [1, 16] (draws per SCORE step, the first "
      "included)")
    target = str(c.get("rubric._target_") or "")
    if c.get("solver.dynamic_sampling.enabled") is True and not target.endswith("ScoreRubrics"):
        c.add(f"solver.dynamic_sampling.enabled=true with rubric={target.rsplit('.', 1)[-1]}: extra draws reuse the "
              "step's one rubric, and this source writes a rubric per query; use rubric=score or disable it")


def check_evaluator(c: Checks) -> None:
    c("evaluator.enabled", *BOOL)
    c("evaluator.static_rubric", *BOOL)
    c("evaluator.update_every", integer(1), "an integer >= 1")
    c("evaluator.ema_beta", number(0.0, 1.0, hi_open=True), "a number in [0, 1)")
    c("evaluator.alpha", number(0.0), "a number >= 0")
    c("evaluator.optimizer", one_of("own", "shared"), "'own' (lr alpha * optim.lr, its own Adam moments) or "
      "'shared' (the solver's AdamW state; alpha weights the loss)")
    if c.get("evaluator.optimizer") == "shared" and c.get("actor.shared") is False:
        c.add("evaluator.optimizer='shared' with actor.shared=false: a separate evaluator model always has its own "
              "optimiser; use evaluator.optimizer=own")
    c("evaluator.temperature", number(0.0, lo_open=True), "a number > 0")
    if c.get("evaluator.scoring_temperature") is not None:
        c("evaluator.scoring_temperature", number(0.0), "null or a number >= 0 (0: greedy)")
    c("evaluator.constrained_scoring", *BOOL)
    c("evaluator.scoring", one_of("joint", "pointwise"),
      "'joint' (one evaluation of all K reports) or 'pointwise' (one evaluation per report)")
    c("evaluator.on_incomplete", one_of("validity", "drop", "neutral"),
      "'validity' (an unjudged report's reward is a(r)), 'drop' (it leaves the update) or 'neutral' (its group gets "
      "advantage 0)")
    c("evaluator.show_retrieved", *BOOL)
    c("evaluator.show_passages", *BOOL)
    c("evaluator.passage_tokens", integer(1), "an integer >= 1 (tokens of each cited passage shown)")
    c("evaluator.max_cited_passages", integer(1), "an integer >= 1 (cited passages shown per report)")
    check_score_readout(c)
    check_scoring_reward(c)
    for field in (c.get("evaluator.constrained_max_chars") or {}):
        if field not in ("think", "query", "section", "reason"):
            c.add(f"evaluator.constrained_max_chars.{field}: unknown field (think, query, section, reason)")
        else:
            c(f"evaluator.constrained_max_chars.{field}", integer(1), "an integer >= 1 (characters)")
    for key in ("max_rubric_tokens", "max_response_tokens", "max_prompt_tokens"):
        c(f"evaluator.{key}", integer(8), "an integer >= 8")
    c("evaluator.max_tool_calls", integer(0, 10), "an integer in [0, 10]")
    c("evaluator.max_report_tokens", integer(1), "an integer >= 1")
    c("evaluator.max_observation_tokens", integer(1), "an integer >= 1")
    rewards = EVALUATOR_REWARDS.names()  # the registered ones (step/objectives.py, methods/)
    c("evaluator.reward", one_of(*rewards), f"one of the registered evaluator rewards: {', '.join(rewards)}")
    c("evaluator.rubric_queries", integer(1), "an integer >= 1")
    if c.get("evaluator.rubric_weight_sum_tol") is not None:
        c("evaluator.rubric_weight_sum_tol", number(0.0, 1.0), "null (weights normalised, sum not checked) or a "
          "number in [0, 1]")
    check_lengths(c)


def check_score_readout(c: Checks) -> None:
    """``evaluator.score_readout``: ``expected`` only where a decoder reads the value distribution (the HF engine's
    grammar fast-forward, on a module that is not sharded), i.e. under constrained scoring."""
    c("evaluator.score_readout", one_of("sampled", "expected"),
      "'sampled' (the value the evaluator wrote) or 'expected' (its expected value over 0..10)")
    if c.get("evaluator.score_readout") != "expected":
        return
    why = []
    if c.get("evaluator.constrained_scoring") is not True:
        why.append("evaluator.constrained_scoring=true (the grammar marks where a value starts)")
    engine = c.get("rollout.engine")
    if engine == "scripted":
        why.append("an HF engine, not rollout=scripted (a script writes its values)")
    if evaluator_on_vllm(c.cfg):
        why.append("an HF scoring engine, not vLLM (its logprobs are the sampled tokens' top-k, not the masked "
                   "value distribution; rollout.evaluator_engine=hf or actor.shared=false scores on HF)")
    if engine in ("hf", "vllm") and not evaluator_on_vllm(c.cfg) and c.get("rollout.grammar_fast_forward") is False:
        why.append("rollout.grammar_fast_forward=true (the fast-forward decoder reads the distribution)")
    if c.get("strategy.name") == "fsdp" and data_parallel_size(c.cfg) > 1:
        why.append("an unsharded evaluator: on a sharded module the HF engine decodes without the fast-forward")
    if why:
        c.add("evaluator.score_readout=expected needs " + "; ".join(why) + "; or use evaluator.score_readout=sampled")


def check_scoring_reward(c: Checks) -> None:
    """``evaluator.scoring_reward``: REINFORCE on the scoring tokens needs scoring the policy samples and trains."""
    c("evaluator.scoring_reward", one_of("none", "pairwise_recall"),
      "'none' (scoring tokens never train, the paper) or 'pairwise_recall' (REINFORCE on whether the scores order "
      "the reports as their item_recall does)")
    if c.get("evaluator.scoring_reward", "none") in (None, "none"):
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
    c("verifier.enabled", *BOOL)
    c("verifier.min_search_depth", integer(0, 10), "an integer in [0, 10]")
    c("verifier.tau_from_harness", *BOOL)
    c("verifier.zero", one_of("reward", "scores"), "'reward' (Algorithm 1: s_i^k = 0) or 'scores' (keep a(r))")
    depth, calls = c.get("verifier.min_search_depth"), c.get("evaluator.max_tool_calls")
    if c.get("verifier.enabled") is True and isinstance(depth, int) and isinstance(calls, int) and depth > calls:
        c.add(f"verifier.min_search_depth={depth}: more searches than evaluator.max_tool_calls={calls} allows, so "
              "the verifier would zero every reward; lower it, raise evaluator.max_tool_calls, or "
              "verifier.enabled=false")
    c("reward.source", one_of("evaluator", "rule"), "'evaluator' (the evaluator's scores) or 'rule' (the known-good "
      "a(r)(1 + q(r)), no evaluator)")
    c("reward.rule_quality", one_of("retrieved_cited", "coverage", "item_recall", "none"),
      "'retrieved_cited', 'coverage', 'item_recall' or 'none' (q(r) of reward.source=rule)")
    if c.get("reward.source") == "rule":
        if c.get("verifier.enabled") is True:
            c.add("reward.source=rule with verifier.enabled=true: the verifier checks the evaluation's searches, and "
                  "with the rule reward no evaluation runs; set verifier.enabled=false (experiment=rule_tiny does)")
        if c.get("evaluator.enabled") is True and c.get("evaluator.reward") in ("discriminative", "preference"):
            c.add(f"reward.source=rule with evaluator.reward={c.get('evaluator.reward')}: that reward reads the "
                  "evaluator's scores, which the rule reward never asks for; use evaluator.reward=consistency or "
                  "evaluator.enabled=false")
    c("reward.require_citation", *BOOL)
    c("reward.citations", one_of("any", "retrieved"),
      "'any' (any bracketed id counts) or 'retrieved' (cited ids must be among the trajectory's retrieved ones)")
    c("reward.min_answer_chars", integer(0), "an integer >= 0")


def check_solver_workflow(c: Checks) -> None:
    """``solver.agent`` (a registered workflow) with the MaMs budgets, and ``reward.step`` (a registered step credit)."""
    workflows = SOLVER_WORKFLOWS.names()  # the registered ones (rollout/workflows.py, methods/)
    c("solver.agent", one_of(*workflows), f"one of the registered solver workflows: {', '.join(workflows)} ('react': "
      "one ReAct loop; 'mams': search / state / report roles; 'rubricem': plan / research / review / answer stages "
      "on a self-written rubric)")
    credits = STEP_CREDIT.names()  # the registered ones (step/objectives.py, methods/)
    c("reward.step", one_of(*credits), f"one of the registered step credits: {', '.join(credits)} ('none'; 'rubric': "
      "ARCO-style step judgements; 'stage': RubricEM's stage judgements, with solver.agent=rubricem)")
    if c.get("reward.step") == "stage" and c.get("solver.agent") != "rubricem":
        c.add(f"reward.step=stage with solver.agent={c.get('solver.agent')!r}: stage credit reads the plan, research, "
              "review and answer stages only solver.agent=rubricem writes")
    if c.get("solver.rubricem.reflection", False) is True and (c.get("reward.step") != "stage"
                                                                or c.get("rollout.mode") == "async"):
        c.add("solver.rubricem.reflection=true needs reward.step=stage (the stage judgements it distils) and "
              "rollout.mode=sync (the memory lives in the trainer; a rollout worker would not see it)")
    if c.get("reward.step") in ("rubric", "stage"):
        c("reward.step_lambda", number(0.0), "a number >= 0 (weight of the step advantage)")
        c("reward.step_max_tokens", integer(8), "an integer >= 8")
        c("reward.step_invalid_reward", number(-1.0, 1.0), "a number in [-1, 1] (valid judgements earn a correlation)")
    if c.get("solver.agent") != "mams":
        return
    c("solver.max_tool_calls", integer(1, 10), "an integer in [1, 10] with solver.agent=mams (a search role call per "
      "turn)")
    for key in ("chunk_tokens", "max_observation_tokens", "search_tokens", "state_tokens", "report_tokens",
                "memory_tokens", "plan_tokens", "max_context_tokens"):
        c(f"solver.mams.{key}", integer(8), "an integer >= 8 (tokens)")
    m = c.get("solver.mams") or {}
    parts = [m.get(k) for k in ("chunk_tokens", "memory_tokens", "plan_tokens", "report_tokens")]
    limit = m.get("max_context_tokens")
    if all(isinstance(v, int) for v in parts + [limit]) and sum(parts) >= limit:
        c.add(f"solver.mams.max_context_tokens={limit}: must exceed chunk + memory + plan + report tokens "
              f"({sum(parts)}), which a role prompt may hold besides the question and instructions")


def check_lengths(c: Checks) -> None:
    """What arithmetic alone refuses; the tokenizer-measured checks are :func:`score_lightning.launch.budgets.check_budgets`."""
    n = 1 if c.get("evaluator.scoring", "joint") == "pointwise" else c.get("solver.num_rollouts")
    report, cap = c.get("evaluator.max_report_tokens"), c.get("evaluator.max_prompt_tokens")
    if all(isinstance(v, int) for v in (n, report, cap)) and n * report >= cap:
        c.add(f"evaluator.max_prompt_tokens={cap}: {n} reports x evaluator.max_report_tokens={report} = "
              f"{n * report} tokens leave no room for the query, rubric and instructions of the scoring "
              "prompt; raise evaluator.max_prompt_tokens or lower evaluator.max_report_tokens")
    max_len = c.get("rollout.max_model_len")
    if c.get("rollout.engine") != "vllm" or not isinstance(max_len, int):
        return
    solver = (c.get("solver.max_prompt_tokens"), c.get("solver.max_response_tokens"))
    scoring = (cap, c.get("evaluator.max_response_tokens"), c.get("evaluator.max_tool_calls"),
               c.get("evaluator.max_observation_tokens"))
    if all(isinstance(v, int) for v in solver) and sum(solver) > max_len:
        c.add(f"rollout.max_model_len={max_len}: shorter than solver.max_prompt_tokens + "
              f"solver.max_response_tokens = {sum(solver)}")
    grows = scoring[0] + scoring[1] + scoring[2] * scoring[3] if all(isinstance(v, int) for v in scoring) else 0
    if evaluator_on_vllm(c.cfg) and grows > max_len:  # an evaluator on HF never reaches vLLM's context
        c.add(f"rollout.max_model_len={max_len}: shorter than an evaluation can grow: evaluator.max_prompt_tokens"
              f" + evaluator.max_response_tokens + evaluator.max_tool_calls x evaluator.max_observation_tokens "
              f"= {scoring[0] + scoring[1] + scoring[2] * scoring[3]} (observations are outside the "
              "evaluator's generation budget)")
