"""The one engine builder: which engine each role (solver, evaluator) generates on, for every process that holds
engines — the trainer (``glue/building.py``: HF, scripted), the ``rollout=vllm`` callback
(``callbacks/vllm_rollout.py``) and the asynchronous rollout worker (``generation/async_worker.py``).

Why one builder: the evaluator's engine under vLLM (the same engine for a shared actor with
``rollout.evaluator_engine=vllm``, else HF generate() on its own module), the HF engines' batch size, grammar
fast-forward and collective forwards were decided in three places that could drift apart. A caller passes what only
it knows: the models (as getters: the trainer's modules are built, sharded and swapped after the engines), whether
their forwards are collective, and how to start vLLM in its process (ranks, threads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

from score_lightning.rollout.modes import evaluator_on_vllm

if TYPE_CHECKING:
    from score_lightning.config.schema import ActorConfig, RolloutConfig, StrategyConfig

#: the rollout.engine values with a builder
KINDS = ("hf", "vllm", "scripted")


class Engines(NamedTuple):
    """A process's engines: the solver role's (rollouts) and the evaluator role's (rubrics, scoring)."""

    solver: object
    evaluator: object
    vllm: object | None = None  # the vLLM engine among them: its owner syncs its weights and closes it


def collective_forwards(strategy: "StrategyConfig", world_size: int) -> bool:
    """An FSDP-sharded module over several processes: every forward is a collective (HF engines decode in lockstep)."""
    return str(strategy.name) == "fsdp" and int(world_size) > 1


def build_engines(rollout: "RolloutConfig", actor: "ActorConfig", tokenizer, solver_model: Callable[[], object] | None,
                  evaluator_model: Callable[[], object] | None, *, kind: str | None = None, collective: bool = False,
                  vllm: Callable[[], object] | None = None) -> Engines:
    """The engines of ``kind`` (default ``rollout.engine``). ``solver_model`` / ``evaluator_model`` return the module
    each HF engine generates on, at each call; ``vllm`` starts the vLLM engine (needed for ``kind=vllm`` only).
    ``actor.shared`` decides whether a vLLM engine also serves the evaluator role."""
    kind = str(rollout.engine) if kind is None else kind
    if kind == "scripted":  # one scripted responder answers every role
        from hydra.utils import instantiate

        from score_lightning.rollout.scripted import ScriptedEngine

        engine = ScriptedEngine(tokenizer, instantiate(rollout.responder))
        return Engines(engine, engine)
    if kind not in KINDS:
        raise ValueError(f"rollout.engine={kind!r} has no engine builder: one of {', '.join(KINDS)}")
    from score_lightning.rollout.hf_engine import HFEngine, fast_forward_options

    def hf(model: Callable[[], object]) -> HFEngine:
        return HFEngine(model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer,
                        int(rollout.max_batch_size), collective, **fast_forward_options(rollout))

    if kind == "hf":
        return Engines(hf(solver_model), hf(evaluator_model))
    if vllm is None:
        raise ValueError("rollout.engine=vllm: the caller starts the vLLM engine (pass vllm=...)")
    engine = vllm()
    # a shared actor scores on vLLM too, unless rollout.evaluator_engine=hf; a separate evaluator keeps HF generate()
    return Engines(engine, engine if evaluator_on_vllm(rollout, actor) else hf(evaluator_model), engine)
