"""``rollout.mode`` and ``rollout.max_staleness``: what the asynchronous rollout worker can run, refused by name
before any model loads when it cannot. The worker runs the HF, vLLM (its own engine) or scripted engine."""

from __future__ import annotations

from score_lightning.launch.config_validation.topology import data_parallel_size
from score_lightning.launch.config_validation.values import Checks


def check_async(c: Checks) -> None:
    if c.get("rollout.mode") != "async":
        return
    if c.get("rollout.engine") == "vllm" and c.get("rollout.enable_sleep_mode") is True:
        c.add("rollout.mode=async with rollout.enable_sleep_mode=true: the worker's vLLM engine generates the next "
              "batch during the update, so it cannot sleep then; set rollout.enable_sleep_mode=false, or "
              "rollout.mode=sync")
    world = data_parallel_size(c.cfg)
    if world > 1:
        c.add(f"rollout.mode=async with {world} data-parallel processes: the step's one rubric and the "
              "dynamic-sampling decisions are collectives over the training processes, which a worker process "
              "cannot join; use one process (strategy=single) or rollout.mode=sync")
    if c.get("strategy.name") == "fsdp":
        c.add("rollout.mode=async with strategy=fsdp: the worker needs whole tensors, and FSDP's parameters are "
              "shards; use strategy=single or rollout.mode=sync")
    target = str(c.get("rubric._target_"))
    if target.endswith("EvolvingRubrics"):
        c.add("rollout.mode=async with rubric=evolving: its buffer of rubric items is edited both when rubrics are "
              "written (in the worker) and when scores are observed (in the trainer), and two copies would diverge; "
              "use rubric=score or rubric=given, or rollout.mode=sync")
    if target.endswith("DeepResearchRubrics"):
        c.add("rollout.mode=async with rubric=drrubric: its rubrics are written in the worker and checkpointed with "
              "the trainer, and the worker's copy would be lost at each request; use rubric=score or rubric=given, "
              "or rollout.mode=sync")
