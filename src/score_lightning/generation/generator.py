"""Stages 1-3 as one object: what a SCORE step *generates* (evidence, rubric, K solver rollouts per query,
scoring, the rewards, and dynamic sampling's extra draws).

Why one object, built by one function: the trainer runs it in ``training_step`` under ``rollout.mode=sync``, and
the asynchronous rollout worker (:mod:`score_lightning.generation.async_worker`) runs its own in its own process
under ``rollout.mode=async``; both come from :func:`build_generator`, so the two generate with the same tokenizer,
rubric source, settings and sampling, which is what makes ``rollout.max_staleness=0`` reproduce synchronous
training exactly. Engines come from :func:`score_lightning.generation.engines.build_engines` (:meth:`Generator.use`),
the retriever from the config in the process that searches (:meth:`Generator.open_retriever`).

What belongs to the run that owns it (harness state, dimension scheduler, step, dynamic sampling's query stream,
RubricEM's reflection memory) it reads through :class:`RunAccess` at each call: the trainer's run state moves
with the meta-harness and checkpoints, the worker's with each request, and the generator keeps no copy to drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from score_lightning import distributed as D
from score_lightning.roles.cited_passages import corpus_texts
from score_lightning.rollout.search_steps import shown_passages
from score_lightning.step.rubric_source import RubricContext
from score_lightning.step.dynamic_sampling import extra_batch, informative_groups, merge_draws, pick_groups
from score_lightning.step.reward_assembly import StepRewards, parse_answers
from score_lightning.step.rollouts import RolloutSettings, initial_evidence, rollout_settings, solver_rollouts
from score_lightning.step.scoring_sources import reward_terms, step_scorer
from score_lightning.step.types import StepRollouts, StepRubric

#: where each trajectory (``Trajectory.meta``) and rubric sample records the policy version that sampled it
POLICY_VERSION = "policy_version"


def stamp_policy_version(ro: StepRollouts, version: int) -> None:
    """Record on every trajectory and rubric sample of ``ro`` which weights sampled it: the number of SCORE
    steps whose updates they hold (DESIGN lesson 9: asynchronous resume needs it; staleness is read from it)."""
    for t in (*ro.solver, *ro.scoring):
        t.meta[POLICY_VERSION] = int(version)
    for sample, _ in ro.rubrics.samples:
        sample.policy_version = int(version)


def trajectory_versions(ro: StepRollouts) -> list[int]:
    """The recorded policy versions of what the solver update trains (its trajectories) and REINFORCE
    trains (the rubric samples); a trajectory without a record is left out."""
    versions = [t.meta[POLICY_VERSION] for t in ro.solver if POLICY_VERSION in t.meta]
    versions += [s.policy_version for s, _ in ro.rubrics.samples if s.policy_version is not None]
    return [int(v) for v in versions]


@dataclass
class RunAccess:
    """What generating reads from the run that owns the generator, at each call (see the module docstring)."""

    harness_state: Callable[[], object]  # the HarnessState of the step being generated
    scheduler: Callable[[], object]  # the DimensionScheduler whose hints shape the rubric prompt (None: no hints)
    step: Callable[[], int]  # the SCORE step being generated
    extra_stream: Callable[[], object]  # dynamic sampling's own QueryStream
    guidance: Callable[[], Callable | None] = lambda: None  # RubricEM's reflection memory, per query id


class Generator:
    """``rubric_context``, ``rollout``, ``score`` and ``draw_until_informative``: the generating stages of a step.

    The rewards read the run's ``reward``, ``verifier`` and ``evaluator`` nodes, dynamic sampling
    ``solver.dynamic_sampling``; ``rollout_settings`` is the loops' plan built from ``solver`` and ``evaluator``.
    Who scores is a registered source, and what is added after it registered terms (step/scoring_sources.py)."""

    def __init__(self, cfg, tokenizer, rubric_source, rollout_settings: RolloutSettings, run: RunAccess):
        self.cfg, self.K, self.run = cfg, int(cfg.solver.num_rollouts), run
        self.tokenizer, self.rubric_source = tokenizer, rubric_source
        self.rollout_settings = rollout_settings
        self.engine = self.evaluator_engine = None  # use(): the trainer's setup, the vLLM callback, the worker
        self.retriever = None  # open_retriever(), or a test's own
        self.scorer, self.terms = step_scorer(cfg.reward, cfg.evaluator), reward_terms(cfg)
        #: clients a source or a term opens on first use, in the process that scores (an external judge), by name
        self.services: dict[str, object] = {}

    @property
    def calls_judge(self) -> bool:
        """Do this run's scores come (in part) from the ``judge`` endpoint? The same on every rank."""
        return self.scorer.calls_judge or any(term.calls_judge for term in self.terms)

    @property
    def harness_state(self):
        return self.run.harness_state()

    @property
    def scheduler(self):
        return self.run.scheduler()

    @property
    def score_step(self) -> int:
        return int(self.run.step())

    def use(self, engines) -> None:
        """Generate on ``engines`` (an :class:`~score_lightning.generation.engines.Engines`) from now on."""
        self.engine, self.evaluator_engine = engines.solver, engines.evaluator

    def open_retriever(self) -> None:
        """The configured retriever, built in the process that searches (an MCP stdio server starts with it)."""
        if self.retriever is None:
            from score_lightning.retrieval.from_config import retriever_from_config

            self.retriever = retriever_from_config(self.cfg.retriever, self.cfg.paths.cache_dir)

    def close(self) -> None:
        """Close what generating opened in this process: the retriever (an MCP stdio server ends with the run, not
        with the process) and the services' clients (the judge's connections)."""
        for opened in (self.retriever, *self.services.values()):
            getattr(opened, "close", lambda: None)()
        self.services.clear()

    def rubric_context(self) -> RubricContext:
        return RubricContext(self.evaluator_engine, self.tokenizer, self.retriever, self.harness_state, self.scheduler,
                             int(self.cfg.evaluator.max_prompt_tokens), float(self.cfg.evaluator.temperature),
                             self.score_step)

    def rollout(self, queries: list[str], query_ids: list[str] | None = None,
                rubric_of: StepRubric | None = None) -> StepRollouts:
        """Stages 1-2: evidence, the step's rubrics (from the configured source; ``rubric_of``: a dynamic-sampling
        draw reuses that step's rubric, with nothing new to train), K solver rollouts per query."""
        ids = [str(i) for i in (query_ids if query_ids is not None else range(len(queries)))]
        evidence, errors = initial_evidence(self.retriever, queries, int(self.cfg.solver.topk))
        if rubric_of is None:
            rubrics = self.rubric_source.step_rubrics(self.rubric_context(), queries, ids, evidence)
        else:
            rubrics = StepRubric([rubric_of.first] * len(queries), [], rubric_of.valid, rubric_of.error,
                                 fallback=[bool(rubric_of.fallback and rubric_of.fallback[0])] * len(queries))
        self.release_caches()  # a stage boundary (see release_caches)
        memory = self.run.guidance()  # RubricEM's reflection memory
        solver = solver_rollouts(self.engine, self.tokenizer, self.retriever, queries, rubrics.per_query,
                                 self.harness_state, self.rollout_settings, memory(ids) if memory else None)
        return StepRollouts(list(queries), rubrics, evidence, errors, solver, query_ids=ids)

    def score(self, ro: StepRollouts) -> StepRewards:
        """Stages 2-3: the configured source scores the K reports of each query (the evaluator role by default), then
        each enabled reward term adds its part (``reward.citation_judge``: DR Tulu's citation term)."""
        rw = self.scorer.score(self, ro, parse_answers(ro.solver, self.tokenizer, self.cfg.reward))
        for term in self.terms:
            rw = term.add(self, ro, rw)
        return rw

    def report_groups(self, ro: StepRollouts, answers) -> tuple[list, list, list | None]:
        """Per query, what an evaluator scores: the K reports (None: no answer), the ids each report's searches
        retrieved, and the passages they showed (see :meth:`shown_passages`). A stage boundary: caches are released."""
        reports = [[a.answer if a.answer else None for a in answers[i:i + self.K]] for i in range(0, len(answers), self.K)]
        sources = [[t.retrieved_ids for t in ro.solver[i:i + self.K]] for i in range(0, len(ro.solver), self.K)]
        shown = self.shown_passages(ro)
        self.release_caches()
        return reports, sources, shown

    def shown_passages(self, ro: StepRollouts):
        """``evaluator.show_passages`` with a retriever that has no local corpus: the passages each report's searches
        showed, per query, per report (with a local corpus the scoring reads the passages from it)."""
        if not self.rollout_settings.show_passages or corpus_texts(self.retriever) is not None:
            return None
        texts = [shown_passages(t, self.tokenizer) for t in ro.solver]
        return [texts[i:i + self.K] for i in range(0, len(texts), self.K)]

    def draw_until_informative(self, ro: StepRollouts, rw: StepRewards) -> tuple[StepRollouts, StepRewards, tuple]:
        """Dynamic sampling (step/dynamic_sampling.py): more draws until B groups carry a signal, at most
        ``max_draws`` in all (decided over all ranks, so collectives stay in step). Returns the step's
        rollouts and rewards, and (groups without signal, groups drawn, draws) for the logs."""
        sampling = self.cfg.solver.dynamic_sampling
        flags = [informative_groups(rw, self.K)]
        draws = [(ro, rw)]
        need = len(ro.queries)
        while (sampling.enabled and len(draws) < int(sampling.max_draws)
               and D.global_max(float(need - sum(int(f.sum()) for f in flags))) > 0):
            extra = extra_batch(self.run.extra_stream(), self.score_step, len(draws), int(sampling.max_draws))
            more = self.rollout(list(extra["prompt"]), [str(i) for i in extra["id"]], rubric_of=ro.rubrics)
            more_rw = self.score(more)
            draws.append((more, more_rw))
            flags.append(informative_groups(more_rw, self.K))
        drawn = (float(sum(int((~f).sum()) for f in flags)), float(sum(len(f) for f in flags)), float(len(draws)))
        if len(draws) == 1:
            return ro, rw, drawn
        ro, rw = merge_draws(draws, pick_groups([f.tolist() for f in flags], need), self.K)
        return ro, rw, drawn

    def release_caches(self) -> None:
        """Drop the HF engines' stored KV caches (``rollout/kv_cache.PrefixStore``) at every stage boundary and
        when rollouts are done. The store serves the later turns of one stage's rows; a stage's rows never extend
        another stage's (each role's system prompt parts from the others' within a few tokens, far below the
        store's 16-token minimum reuse), so a stored cache of the rubric or solver calls only held memory during
        the next stage: on SmolLM2, the solver's turns (~0.5 GB) stayed alive through pointwise scoring. Dropping
        them changes no computation."""
        for engine in (self.engine, self.evaluator_engine):
            getattr(engine, "release_cache", lambda: None)()


def build_generator(cfg, tokenizer_path: str, run: RunAccess) -> Generator:
    """The one place a generator's collaborators are built from the config (the trainer's and the worker's): the
    tokenizer, the rubric source (``rubric``: configs/rubric/), the rollout settings."""
    from hydra.utils import instantiate

    from score_lightning.policy.models import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path, chat_template=cfg.model.chat_template)
    return Generator(cfg, tokenizer, instantiate(cfg.rubric, _convert_="all"),
                     rollout_settings(cfg.solver, cfg.evaluator), run)


class _Generators:
    """An attribute of a host that is its ``generator``'s: read and set through the host, held once."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, host, owner: type | None = None):
        return self if host is None else getattr(host.generator, self.name)

    def __set__(self, host, value) -> None:
        setattr(host.generator, self.name, value)


class GeneratorHost:
    """A host (``ScoreModule``) that holds a ``generator``: what callbacks, method plug-ins and tests read or swap on
    the host (``module.engine``, ``module.retriever``, ``module.rollout`` ...) is the generator's own, so the vLLM
    callback's engine or a test's stub is the one generation uses."""

    tokenizer = _Generators()
    engine = _Generators()
    evaluator_engine = _Generators()
    retriever = _Generators()
    rubric_source = _Generators()
    rollout_settings = _Generators()
    rubric_context = _Generators()
    rollout = _Generators()
    score = _Generators()
    draw_until_informative = _Generators()
