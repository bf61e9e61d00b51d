"""The run around the step: trainer, threads, strategy, retriever, data, harness, callbacks, files it reads."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from score_lightning.launch.config_validation.values import Checks, integer, number


def check_run(c: Checks) -> None:
    c("seed", integer(0), "an integer >= 0")
    c("threads.num", lambda v: v == "auto" or integer(1)(v), "'auto' or an integer >= 1 (CPU threads per process)")
    if c.get("callbacks.adaptive_threads") is not None:
        c("callbacks.adaptive_threads.every_n_steps", integer(0), "an integer >= 0 (0: the launch-time count stays)")
        c("callbacks.adaptive_threads.margin", number(0.0, 0.5, hi_open=True), "a number of cores in [0, 0.5)")
        c("callbacks.adaptive_threads.rise_after", integer(1), "an integer >= 1 (readings before a thread is added)")
    if c.get("retriever.kind") == "mcp":
        check_mcp(c)
    if c.get("retriever.kind") == "http" and not OmegaConf.is_missing(c.cfg.retriever, "url"):
        c("retriever.url", lambda v: isinstance(v, str) and v.startswith(("http://", "https://")), "an http(s):// URL")
    check_harness(c)
    c("callbacks.preemption.grace_s", number(0.0), "a number of seconds >= 0")
    check_evaluator_pairs(c)
    c("debug.nan_grad_steps", lambda v: all(isinstance(x, int) and x >= 0 for x in v), "a list of SCORE step numbers")
    check_files(c)


def check_evaluator_pairs(c: Checks) -> None:
    """``callbacks.evaluator_pairs`` (the in-run evaluator probe): a stored pair set, one process, sync rollouts."""
    if c.get("callbacks.evaluator_pairs") is None:
        return
    c("callbacks.evaluator_pairs.every_n_steps", integer(0), "an integer >= 0 (0: off)")
    every = c.get("callbacks.evaluator_pairs.every_n_steps")
    if not isinstance(every, int) or every <= 0:
        return
    path = c.get("callbacks.evaluator_pairs.pair_set")
    if not path:
        c.add("callbacks.evaluator_pairs.every_n_steps > 0 needs callbacks.evaluator_pairs.pair_set: a stored pair set "
              "(python scripts/bench_evaluator.py --split train ... writes one)")
    else:
        from score_lightning.evaluation.pair_set import PairSetError, read_pair_set

        try:
            read_pair_set(path)
        except PairSetError as exc:
            c.add(f"callbacks.evaluator_pairs.pair_set: {exc}")
    if c.get("rollout.mode") == "async":
        c.add("callbacks.evaluator_pairs with rollout.mode=async: the rollout worker holds the engine; use "
              "rollout.mode=sync, or score checkpoints with scripts/bench_evaluator.py --model")


def check_harness(c: Checks) -> None:
    from score_lightning.harness.state import HarnessState, HarnessStateError

    try:
        HarnessState.from_dict(OmegaConf.to_container(c.cfg.harness.initial_state, resolve=True))
    except HarnessStateError as exc:
        c.add(f"harness.initial_state.{exc}")


def check_files(c: Checks) -> None:
    """Files the run reads are read now (a resume checkpoint, given rubrics, preference pairs), so a bad
    one fails before any model loads."""
    for key in ("retriever.corpus_path", "data.queries_path"):
        value = c.get(key)
        if value is not None and not Path(str(value)).is_file():
            c.add(f"{key}={value!r}: file not found")
    ckpt = c.cfg.ckpt_path
    if ckpt is not None:
        from score_lightning.generation.batch_codec import check_stored_batch
        from score_lightning.policy.checkpoint_io import CheckpointError, validate_checkpoint

        try:
            step = validate_checkpoint(str(ckpt), check_stored_batch)
        except CheckpointError as exc:
            c.add(str(exc))
        else:
            max_steps = c.get("trainer.max_steps")
            if step is not None and isinstance(max_steps, int) and 0 <= max_steps <= step:
                c.add(f"trainer.max_steps={max_steps}: ckpt_path={ckpt} already holds SCORE step {step}, so resuming "
                      f"would train nothing; trainer.max_steps counts SCORE steps from the start of the run: set it "
                      f"above {step} (e.g. trainer.max_steps={step + max(max_steps, 1)})")
    from score_lightning.data.corpus import DataFormatError

    if str(c.get("rubric._target_")).endswith("GivenRubrics"):
        if OmegaConf.is_missing(c.cfg.rubric, "path"):  # rubric=given's key, required
            c.add("rubric.path: required with rubric=given (a criteria.jsonl or checklist file)")
        else:
            from score_lightning.methods.given.rubrics import load_given_rubrics

            try:
                load_given_rubrics(c.cfg.rubric.path)
            except DataFormatError as exc:
                c.add(f"rubric.path: {exc}")
    if c.get("reward.rule_quality") == "item_recall":
        check_items(c)
    if c.get("evaluator.reward") == "preference":
        path = c.get("evaluator.preferences_path")
        if not path:
            c.add("evaluator.preferences_path: required with evaluator.reward=preference")
        else:
            from score_lightning.methods.preference.reward import load_preferences

            try:
                load_preferences(path)
            except DataFormatError as exc:
                c.add(f"evaluator.preferences_path: {exc}")
        group = c.get("evaluator.preference.group_size")
        if isinstance(group, int) and group > 1 and not str(c.get("rubric._target_")).endswith("ScoreRubrics"):
            c.add(f"evaluator.preference.group_size={group} with rubric={str(c.get('rubric._target_')).rsplit('.', 1)[-1]}:"
                  " each pair's group of rubrics is written as SCORE's rubric (dimensions and weights from the pool); "
                  "use rubric=score, or group_size=1")


def check_items(c: Checks) -> None:
    """``reward.rule_quality=item_recall``: the items file loads and holds every training query."""
    from score_lightning.data.corpus import DataFormatError
    from score_lightning.data.queries import load_queries
    from score_lightning.data.items import load_items

    path, queries = c.get("reward.items_path"), c.get("data.queries_path")
    if path is None and queries is not None:
        c.add("reward.rule_quality=item_recall with data.queries_path set: the embedded items cover the embedded "
              "queries only; build items for yours (scripts/build_rubrics.py --queries ...) and set reward.items_path")
        return
    try:
        items = load_items(path)
        ids = {q.id for q in load_queries(queries, c.get("data.split") or None)}
    except (DataFormatError, FileNotFoundError) as exc:
        c.add(f"reward.items_path: {exc}")
        return
    missing = sorted(i for i in ids if i not in items or not items[i].items)
    if missing:
        c.add(f"reward.items_path: {len(missing)} training queries have no items (e.g. {missing[:3]}); "
              "reward.rule_quality=item_recall would score them 0 whatever they write")


def check_mcp(c: Checks) -> None:
    """``retriever=mcp``: the SDK, one server (a streamable-HTTP url or a stdio command), the tool and its arguments."""
    from score_lightning.policy.preflight import missing_package

    line = missing_package("mcp", "retriever=mcp", "pip install -e '.[mcp]'", package="mcp")
    if line is not None:
        c.add(line)
    url, command = c.get("retriever.url"), c.get("retriever.command")
    if (url is None) == (command is None):
        c.add("retriever=mcp needs exactly one of retriever.url (streamable HTTP, e.g. http://127.0.0.1:8002/mcp) and "
              "retriever.command (stdio: the server's command line)")
    elif url is not None:
        c("retriever.url", lambda v: isinstance(v, str) and v.startswith(("http://", "https://")), "an http(s):// URL")
    for key in ("retriever.tool", "retriever.query_arg"):
        c(key, lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty name")
    if c.get("retriever.topk_arg") is not None:
        c("retriever.topk_arg", lambda v: isinstance(v, str) and bool(v.strip()), "null or a non-empty name")
