"""Validate the whole config before any model loads: fail in seconds, naming the key and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, ListConfig, OmegaConf


from score_lightning.errors import ConfigError  # noqa: E402  (re-exported: callers import it from here)
from score_lightning.top_layers import check_trainable_layers


def _get(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key, throw_on_missing=False, default="__missing__")
    if value == "__missing__":
        raise ConfigError(f"{key}: missing from the config")
    return value


def _check(cfg: DictConfig, key: str, ok: Callable[[Any], bool], allowed: str, errors: list[str]) -> None:
    try:
        value = _get(cfg, key)
    except ConfigError as exc:
        errors.append(str(exc))
        return
    try:
        good = ok(value)
    except Exception:  # a wrong type makes the predicate raise: that is a bad value too
        good = False
    if not good:
        errors.append(f"{key}={value!r}: allowed {allowed}")


def _int(lo: int, hi: int | None = None) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)


def _num(lo: float, hi: float | None = None, lo_open: bool = False, hi_open: bool = False) -> Callable[[Any], bool]:
    def ok(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if (v <= lo) if lo_open else (v < lo):
            return False
        if hi is not None and ((v >= hi) if hi_open else (v > hi)):
            return False
        return True
    return ok


_BOOL = (lambda v: isinstance(v, bool), "true or false")
_PRECISIONS = {"32-true", "32", "bf16-mixed", "bf16-true", "64-true"}
_DTYPES = {"float32", "fp32", "bfloat16", "bf16", "float16", "fp16"}  # models.resolve_dtype (no torch import here)
_LOW_PRECISION = {"bfloat16", "bf16", "float16", "fp16"}
#: at or below this lr an AdamW step (~lr) is smaller than half the bf16/fp16 spacing of typical weights
LOW_PRECISION_MAX_LR = 1e-5


def validate_config(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` listing every bad value (all of them, not just the first)."""
    e: list[str] = []
    c = lambda key, ok, allowed: _check(cfg, key, ok, allowed, e)  # noqa: E731
    c("seed", _int(0), "an integer >= 0")
    c("solver.num_rollouts", _int(2), "an integer >= 2 (GRPO normalises over the K rollouts of a query)")
    c("solver.max_tool_calls", _int(0, 10), "an integer in [0, 10]")
    c("solver.max_response_tokens", _int(8), "an integer >= 8")
    c("solver.max_prompt_tokens", _int(8), "an integer >= 8")
    c("solver.max_observation_tokens", _int(1), "an integer >= 1")
    c("solver.topk", _int(1, 100), "an integer in [1, 100]")
    c("solver.temperature", _num(0.0, lo_open=True), "a number > 0 (RL needs sampling)")
    c("solver.top_p", _num(0.0, 1.0, lo_open=True), "a number in (0, 1]")
    c("solver.freeze", *_BOOL)
    c("actor.shared", *_BOOL)
    c("evaluator.enabled", *_BOOL)
    c("evaluator.static_rubric", *_BOOL)
    c("evaluator.update_every", _int(1), "an integer >= 1")
    c("evaluator.ema_beta", _num(0.0, 1.0, hi_open=True), "a number in [0, 1)")
    c("evaluator.alpha", _num(0.0), "a number >= 0")
    c("evaluator.optimizer", lambda v: v in ("own", "shared"), "'own' (lr alpha * optim.lr, its own Adam moments) or "
      "'shared' (the solver's AdamW state; alpha weights the loss)")
    if OmegaConf.select(cfg, "evaluator.optimizer") == "shared" and OmegaConf.select(cfg, "actor.shared") is False:
        e.append("evaluator.optimizer='shared' with actor.shared=false: a separate evaluator model always has its own "
                 "optimiser; use evaluator.optimizer=own")
    c("evaluator.temperature", _num(0.0, lo_open=True), "a number > 0")
    if cfg.evaluator.get("scoring_temperature") is not None:
        c("evaluator.scoring_temperature", _num(0.0), "null or a number >= 0 (0: greedy)")
    c("evaluator.constrained_scoring", *_BOOL)
    c("evaluator.scoring", lambda v: v in ("joint", "pointwise"),
      "'joint' (one evaluation of all K reports) or 'pointwise' (one evaluation per report)")
    c("evaluator.show_retrieved", *_BOOL)
    for field in (cfg.evaluator.get("constrained_max_chars") or {}):
        if field not in ("think", "query", "section", "reason"):
            e.append(f"evaluator.constrained_max_chars.{field}: unknown field (think, query, section, reason)")
        else:
            c(f"evaluator.constrained_max_chars.{field}", _int(1), "an integer >= 1 (characters)")
    c("evaluator.max_rubric_tokens", _int(8), "an integer >= 8")
    c("evaluator.max_response_tokens", _int(8), "an integer >= 8")
    c("evaluator.max_tool_calls", _int(0, 10), "an integer in [0, 10]")
    c("evaluator.max_report_tokens", _int(1), "an integer >= 1")
    c("evaluator.max_prompt_tokens", _int(8), "an integer >= 8")
    c("evaluator.max_observation_tokens", _int(1), "an integer >= 1")
    _check_lengths(cfg, e)
    c("verifier.enabled", *_BOOL)
    c("verifier.min_search_depth", _int(0, 10), "an integer in [0, 10]")
    c("verifier.tau_from_harness", *_BOOL)
    depth, calls = OmegaConf.select(cfg, "verifier.min_search_depth"), OmegaConf.select(cfg, "evaluator.max_tool_calls")
    if (OmegaConf.select(cfg, "verifier.enabled") is True and isinstance(depth, int) and isinstance(calls, int)
            and depth > calls):
        e.append(f"verifier.min_search_depth={depth}: more searches than evaluator.max_tool_calls={calls} allows, so "
                 "the verifier would zero every reward; lower it, raise evaluator.max_tool_calls, or "
                 "verifier.enabled=false")
    c("reward.require_citation", *_BOOL)
    c("reward.citations", lambda v: v in ("any", "retrieved"),
      "'any' (any bracketed id counts) or 'retrieved' (cited ids must be among the trajectory's retrieved ones)")
    c("reward.min_answer_chars", _int(0), "an integer >= 0")
    c("loss.kl_coef", _num(0.0), "a number >= 0")
    c("loss.clip_ratio_low", _num(0.0, 1.0, hi_open=True), "a number in [0, 1)")
    c("loss.clip_ratio_high", _num(0.0), "a number >= 0")
    c("loss.entropy_coef", _num(0.0), "a number >= 0")
    c("loss.norm_adv_by_std", *_BOOL)
    c("optim.lr", _num(0.0, lo_open=True), "a number > 0")
    c("optim.warmup_steps", _int(0), "an integer >= 0")
    c("optim.warmup_start_ratio", _num(0.0, 1.0), "a number in [0, 1]")
    if OmegaConf.select(cfg, "optim.warmup_ratio") is not None:
        c("optim.warmup_ratio", _num(0.0, 1.0, hi_open=True), "null or a number in [0, 1) (a share of trainer.max_steps)")
    c("optim.weight_decay", _num(0.0), "a number >= 0")
    c("optim.grad_clip", _num(0.0), "a number >= 0 (0 disables clipping)")
    c("optim.ppo_epochs", _int(1), "an integer >= 1")
    c("optim.mini_batch_size", _int(1), "an integer >= 1 (queries per optimiser step)")
    c("optim.micro_batch_size", _int(1), "an integer >= 1 (trajectories per forward/backward)")
    c("optim.max_consecutive_skips", _int(1), "an integer >= 1")
    c("data.batch_size", _int(1), "an integer >= 1")
    c("harness.every_n_steps", _int(1), "an integer >= 1")
    c("harness.enabled", *_BOOL)
    c("retriever.max_failed_steps", _int(1), "an integer >= 1")
    c("callbacks.preemption.grace_s", _num(0.0), "a number of seconds >= 0")
    c("debug.nan_grad_steps", lambda v: all(isinstance(x, int) and x >= 0 for x in v), "a list of SCORE step numbers")
    c("trainer.max_steps", _int(1), "an integer >= 1 (SCORE steps)")
    if OmegaConf.select(cfg, "trainer.malloc_mmap_threshold_mb") is not None:
        c("trainer.malloc_mmap_threshold_mb", _num(0.0, 32.0), "null or a number of MB in [0, 32] (glibc's maximum)")
    if OmegaConf.select(cfg, "threads") is not None:
        c("threads.num", lambda v: v == "auto" or _int(1)(v), "'auto' or an integer >= 1 (CPU threads per process)")
        c("threads.runs", _int(1), "an integer >= 1 (independent runs sharing this machine's cores)")
    c("trainer.precision", lambda v: str(v) in _PRECISIONS, f"one of {sorted(_PRECISIONS)} (fp16 with a grad scaler is not supported)")
    c("retriever.kind", lambda v: v in ("bm25", "http"), "'bm25' or 'http'")
    c("rollout.engine", lambda v: v in ("hf", "vllm", "scripted"), "'hf', 'vllm' or 'scripted'")
    c("verifier.zero", lambda v: v in ("reward", "scores"), "'reward' (Algorithm 1: s_i^k = 0) or 'scores' (keep a(r))")
    c("evaluator.reward", lambda v: v in ("consistency", "discriminative", "preference", "solver_reward"),
      "'consistency', 'discriminative', 'preference' or 'solver_reward'")
    c("evaluator.rubric_queries", _int(1), "an integer >= 1")
    if OmegaConf.select(cfg, "evaluator.rubric_weight_sum_tol") is not None:
        c("evaluator.rubric_weight_sum_tol", _num(0.0, 1.0), "null (weights normalised, sum not checked) or a number "
          "in [0, 1]")
    c("solver.conclusion_line", *_BOOL)
    c("optim.eps", _num(0.0, lo_open=True), "a number > 0")
    c("strategy.name", lambda v: v in ("single", "ddp", "fsdp"), "'single', 'ddp' or 'fsdp'")
    if OmegaConf.select(cfg, "strategy.name") == "fsdp":
        c("strategy.mixed_precision", lambda v: v in (None, "bf16", "bfloat16"), "null or 'bf16'")
    if OmegaConf.select(cfg, "retriever.kind") == "http":
        c("retriever.url", lambda v: isinstance(v, str) and v.startswith(("http://", "https://")), "an http(s):// URL")
    for key in ("retriever.corpus_path", "data.queries_path"):
        value = OmegaConf.select(cfg, key)
        if value is not None and not Path(str(value)).is_file():
            e.append(f"{key}={value!r}: file not found")
    ckpt = OmegaConf.select(cfg, "ckpt_path")
    if ckpt is not None:
        from score_lightning.checkpoint_io import CheckpointError, validate_checkpoint

        try:
            validate_checkpoint(str(ckpt))
        except CheckpointError as exc:
            e.append(str(exc))
    if pretrained_model(cfg) is None and OmegaConf.select(cfg, "model.tiny") is None:
        e.append("model.name_or_path: null needs model.tiny (the tiny-model spec) or model.gguf; set a checkpoint "
                 "path or use model=tiny")
    gguf = OmegaConf.select(cfg, "model.gguf")
    if OmegaConf.select(cfg, "model.name_or_path") is None and gguf is not None:
        from score_lightning.gguf_checkpoint import gguf_problems  # light: no torch, no transformers

        e.extend(gguf_problems(OmegaConf.to_container(gguf, resolve=True)))
    _check_master_weights(cfg, e)
    template = OmegaConf.select(cfg, "model.chat_template")
    if isinstance(template, str) and template and "{" not in template and not Path(template).expanduser().is_file():
        e.append(f"model.chat_template={template!r}: neither a Jinja template nor a file")
    mb, bs = OmegaConf.select(cfg, "optim.mini_batch_size"), OmegaConf.select(cfg, "data.batch_size")
    if isinstance(mb, int) and isinstance(bs, int) and mb > bs:
        e.append(f"optim.mini_batch_size={mb}: must be <= data.batch_size={bs}")
    world = data_parallel_size(cfg)
    if world > 1 and isinstance(mb, int) and mb % world:
        e.append(f"optim.mini_batch_size={mb}: counts global queries and must be divisible by the {world} "
                 "data-parallel processes")
    if (OmegaConf.select(cfg, "solver.freeze") is True and OmegaConf.select(cfg, "actor.shared") is True
            and OmegaConf.select(cfg, "evaluator.enabled") is True):
        e.append("solver.freeze=true: with actor.shared=true the evaluator's REINFORCE update moves the shared "
                 "weights, so the solver would not be frozen; set actor.shared=false (frozen solver, trained "
                 "evaluator) or evaluator.enabled=false (nothing trains)")
    _check_harness(cfg, e)
    _check_sft(cfg, e)
    _check_rubric_files(cfg, e)
    _check_lora(cfg, e)
    check_trainable_layers(cfg, e)
    _check_solver_workflow(cfg, e)
    if e:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(e))


def _check_lengths(cfg: DictConfig, errors: list[str]) -> None:
    """What arithmetic alone refuses; the tokenizer-measured checks are :func:`score_lightning.budgets.check_budgets`."""
    n = 1 if OmegaConf.select(cfg, "evaluator.scoring", default="joint") == "pointwise" else \
        OmegaConf.select(cfg, "solver.num_rollouts")
    report, cap = OmegaConf.select(cfg, "evaluator.max_report_tokens"), OmegaConf.select(cfg, "evaluator.max_prompt_tokens")
    if all(isinstance(v, int) for v in (n, report, cap)) and n * report >= cap:
        errors.append(f"evaluator.max_prompt_tokens={cap}: {n} reports x evaluator.max_report_tokens={report} = "
                      f"{n * report} tokens leave no room for the query, rubric and instructions of the scoring "
                      "prompt; raise evaluator.max_prompt_tokens or lower evaluator.max_report_tokens")
    max_len = OmegaConf.select(cfg, "rollout.max_model_len", default=None)
    if OmegaConf.select(cfg, "rollout.engine") != "vllm" or not isinstance(max_len, int):
        return
    sel = lambda k: OmegaConf.select(cfg, k)  # noqa: E731
    solver = (sel("solver.max_prompt_tokens"), sel("solver.max_response_tokens"))
    scoring = (cap, sel("evaluator.max_response_tokens"), sel("evaluator.max_tool_calls"),
               sel("evaluator.max_observation_tokens"))
    if all(isinstance(v, int) for v in solver) and sum(solver) > max_len:
        errors.append(f"rollout.max_model_len={max_len}: shorter than solver.max_prompt_tokens + "
                      f"solver.max_response_tokens = {sum(solver)}")
    if all(isinstance(v, int) for v in scoring) and scoring[0] + scoring[1] + scoring[2] * scoring[3] > max_len:
        errors.append(f"rollout.max_model_len={max_len}: shorter than an evaluation can grow: evaluator.max_prompt_tokens"
                      f" + evaluator.max_response_tokens + evaluator.max_tool_calls x evaluator.max_observation_tokens "
                      f"= {scoring[0] + scoring[1] + scoring[2] * scoring[3]} (observations are outside the "
                      "evaluator's generation budget)")


def data_parallel_size(cfg: DictConfig) -> int:
    """Processes that split the global batch: devices x nodes for ddp/fsdp, else 1."""
    if OmegaConf.select(cfg, "strategy.name") not in ("ddp", "fsdp"):
        return 1
    devices = OmegaConf.select(cfg, "trainer.devices")
    devices = list(devices) if isinstance(devices, ListConfig) else devices
    return data_parallel_processes(devices, OmegaConf.select(cfg, "trainer.num_nodes") or 1,
                                   OmegaConf.select(cfg, "strategy.tensor_parallel_size") or 1)


def data_parallel_processes(devices: int | str | list, num_nodes: int, tensor_parallel_size: int = 1) -> int:
    """devices x nodes / tensor-parallel size (Lightning's own "auto" data-parallel size would mean num_nodes)."""
    if isinstance(devices, str):
        devices = int(devices) if devices.isdigit() else 1
    per_node = devices if isinstance(devices, int) else len(devices)
    return max(1, int(per_node) * int(num_nodes) // int(tensor_parallel_size))


def _check_master_weights(cfg: DictConfig, errors: list[str]) -> None:
    """``model.dtype`` is the dtype of the weights the optimiser updates (FSDP2 shards them as loaded).

    bf16 keeps 8 significant bits: near a weight of 0.02 its spacing is ~1.2e-4, so an AdamW step of
    ~lr = 1e-6 rounds back to the same weight and the run trains almost nothing, silently. Compute
    in bf16 comes from ``trainer.precision`` / ``strategy.mixed_precision`` instead.
    """
    _check(cfg, "model.dtype", lambda v: v in _DTYPES, f"one of {sorted(_DTYPES)}", errors)
    dtype, lr = OmegaConf.select(cfg, "model.dtype"), OmegaConf.select(cfg, "optim.lr")
    if dtype not in _LOW_PRECISION or not isinstance(lr, (int, float)) or lr > LOW_PRECISION_MAX_LR:
        return
    if OmegaConf.select(cfg, "model.allow_low_precision_weights", default=False) is True:
        return
    errors.append(f"model.dtype={dtype!r} with optim.lr={lr:g}: the optimiser would update {dtype} master weights, "
                  f"whose spacing near a weight of 0.02 is ~1.2e-4 (bf16) or ~1.5e-5 (fp16), so steps of ~lr round "
                  "away and the run trains almost nothing; use model.dtype=float32 (bf16 compute comes from "
                  "trainer.precision=bf16-mixed and strategy.mixed_precision=bf16), or set "
                  "model.allow_low_precision_weights=true if the rounding is intended")


def _check_lora(cfg: DictConfig, errors: list[str]) -> None:
    """``model.lora`` (absent means disabled): its values, peft installed, and what LoRA cannot do."""
    if OmegaConf.select(cfg, "model.lora.enabled") is not True:
        return
    c = lambda key, ok, allowed: _check(cfg, key, ok, allowed, errors)  # noqa: E731
    c("model.lora.r", _int(1), "an integer >= 1 (the adapter rank)")
    c("model.lora.alpha", _num(0.0, lo_open=True), "a number > 0 (scaling = alpha / r)")
    c("model.lora.dropout", _num(0.0, 1.0, hi_open=True), "a number in [0, 1)")
    names = lambda v: isinstance(v, ListConfig) and len(v) > 0 and all(isinstance(x, str) and x for x in v)  # noqa: E731
    c("model.lora.target_modules", lambda v: v == "all-linear" or names(v),
      "'all-linear' or a non-empty list of module names, e.g. [q_proj, v_proj]")
    from score_lightning.preflight import missing_package

    line = missing_package("peft", "model.lora.enabled=true", "pip install -e '.[lora]'")
    if line:
        errors.append(line)
    if OmegaConf.select(cfg, "actor.shared") is False:
        errors.append("model.lora.enabled=true with actor.shared=false: a separate evaluator is not supported with "
                      "LoRA. It would need a second full base model (what LoRA is meant to avoid) or a second "
                      "adapter on the shared base, whose switching of peft's active adapter per role rewrites "
                      "requires_grad and leaves one adapter unused in each backward (DDP, FSDP2); "
                      "use actor.shared=true")


def _check_solver_workflow(cfg: DictConfig, errors: list[str]) -> None:
    """``solver.agent`` (react | mams) with the MaMs budgets, and ``reward.step`` (none | rubric)."""
    c = lambda key, ok, allowed: _check(cfg, key, ok, allowed, errors)  # noqa: E731
    c("solver.agent", lambda v: v in ("react", "mams"), "'react' (one ReAct loop) or 'mams' (search / state / report roles)")
    c("reward.step", lambda v: v in ("none", "rubric"), "'none' or 'rubric' (ARCO-style step judgements)")
    if OmegaConf.select(cfg, "reward.step") == "rubric":
        c("reward.step_lambda", _num(0.0), "a number >= 0 (weight of the step advantage)")
        c("reward.step_max_tokens", _int(8), "an integer >= 8")
        c("reward.step_invalid_reward", _num(-1.0, 1.0), "a number in [-1, 1] (valid judgements earn a correlation)")
    if OmegaConf.select(cfg, "solver.agent") != "mams":
        return
    c("solver.max_tool_calls", _int(1, 10), "an integer in [1, 10] with solver.agent=mams (a search role call per turn)")
    for key in ("chunk_tokens", "max_observation_tokens", "search_tokens", "state_tokens", "report_tokens",
                "memory_tokens", "plan_tokens", "max_context_tokens"):
        c(f"solver.mams.{key}", _int(8), "an integer >= 8 (tokens)")
    m = OmegaConf.select(cfg, "solver.mams") or {}
    parts = [m.get(k) for k in ("chunk_tokens", "memory_tokens", "plan_tokens", "report_tokens")]
    limit = m.get("max_context_tokens")
    if all(isinstance(v, int) for v in parts + [limit]) and sum(parts) >= limit:
        errors.append(f"solver.mams.max_context_tokens={limit}: must exceed chunk + memory + plan + report tokens "
                      f"({sum(parts)}), which a role prompt may hold besides the question and instructions")


def _check_rubric_files(cfg: DictConfig, errors: list[str]) -> None:
    """Given rubrics and preference pairs are read now, so a bad line fails before any model loads."""
    from score_lightning.data.corpus import DataFormatError

    target = str(OmegaConf.select(cfg, "rubric._target_") or "")
    if target.endswith("GivenRubrics"):
        path = OmegaConf.select(cfg, "rubric.path", throw_on_missing=False, default=None)
        if path in (None, "???") or OmegaConf.is_missing(cfg.rubric, "path"):
            errors.append("rubric.path: required with rubric=given (a criteria.jsonl or checklist file)")
        else:
            from score_lightning.rubrics.given import load_given_rubrics

            try:
                load_given_rubrics(path)
            except DataFormatError as exc:
                errors.append(f"rubric.path: {exc}")
    if OmegaConf.select(cfg, "evaluator.reward") == "preference":
        path = OmegaConf.select(cfg, "evaluator.preferences_path")
        if not path:
            errors.append("evaluator.preferences_path: required with evaluator.reward=preference")
        else:
            from score_lightning.rubrics.preference import load_preferences

            try:
                load_preferences(path)
            except DataFormatError as exc:
                errors.append(f"evaluator.preferences_path: {exc}")


#: SFT settings that only suit the from-scratch tiny model: (key, refused when, what they are for)
_FROM_SCRATCH_SFT = (("sft.lr", lambda v: v > 1e-4, "a from-scratch learning rate"),
                     ("sft.prompt_loss_weight", lambda v: v > 0, "loss on prompt tokens, to learn their language"))


def pretrained_model(cfg: DictConfig) -> str | None:
    """What names a pretrained model: ``model.name_or_path``, else ``model.gguf`` (a GGUF inside an installed
    package, e.g. ``model=smollm2_135m``); ``None`` for the from-scratch tiny model."""
    path = OmegaConf.select(cfg, "model.name_or_path")
    if path is not None:
        return str(path)
    gguf = OmegaConf.select(cfg, "model.gguf")
    return f"{gguf.package}:{gguf.file}" if gguf is not None else None


def sft_enabled(cfg: DictConfig) -> bool:
    """``sft.enabled``: true, false, or ``auto``, on only for the tiny model (no pretrained model configured).

    Why ``auto``: ``experiment=tiny_score`` needs its cold start, but the same experiment pointed at a
    pretrained checkpoint must not run the tiny model's from-scratch settings on it.
    """
    value = OmegaConf.select(cfg, "sft.enabled", default=False)
    if value == "auto":
        return pretrained_model(cfg) is None
    return value is True


def _check_sft(cfg: DictConfig, errors: list[str]) -> None:
    """Refuse the tiny model's cold-start settings on a pretrained checkpoint, naming the keys and the fix."""
    if OmegaConf.select(cfg, "sft") is None:
        return
    _check(cfg, "sft.enabled", lambda v: v in (True, False, "auto"), "true, false or 'auto' (on for the tiny model only)",
           errors)
    path = pretrained_model(cfg)
    if path is None or not sft_enabled(cfg):
        return
    for key, bad, why in _FROM_SCRATCH_SFT:
        value = OmegaConf.select(cfg, key)
        if isinstance(value, (int, float)) and bad(value):
            errors.append(f"{key}={value!r} with a pretrained model.name_or_path={path!r}: {why}, one of the "
                          "from-scratch tiny model's settings (configs/sft/default.yaml); use sft=pretrained "
                          "(lr 1e-5, no prompt loss, bf16 on GPU, 1 epoch) or sft.enabled=false")


def _check_harness(cfg: DictConfig, errors: list[str]) -> None:
    from score_lightning.harness.state import HarnessState, HarnessStateError

    init = OmegaConf.select(cfg, "harness.initial_state")
    try:
        HarnessState.from_dict(OmegaConf.to_container(init, resolve=True) if init is not None else {})
    except HarnessStateError as exc:
        errors.append(f"harness.initial_state.{exc}")
