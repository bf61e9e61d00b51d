"""The loss, the optimiser and its batches: what the update computes and how much of it reaches the weights."""

from __future__ import annotations

import logging

from score_lightning.launch.config_validation.values import Checks, integer, one_of
from score_lightning.launch.config_validation.topology import data_parallel_size
from score_lightning.launch.schema import known_names, method_checks
from score_lightning.step.correction_modes import MODES, resolve_mode

log = logging.getLogger(__name__)


def check_update(c: Checks) -> None:
    mb, bs = c.get("optim.mini_batch_size"), c.get("data.batch_size")
    if isinstance(mb, int) and isinstance(bs, int) and mb > bs:
        c.add(f"optim.mini_batch_size={mb}: must be <= data.batch_size={bs}")
    world = data_parallel_size(c.cfg)
    if world > 1 and isinstance(mb, int) and mb % world:
        c.add(f"optim.mini_batch_size={mb}: counts global queries and must be divisible by the {world} "
              "data-parallel processes")
    check_rollout_correction(c)
    check_loss_variants(c)
    check_solver_objective(c)


def check_solver_objective(c: Checks) -> None:
    """The selected solver objective's own rules across keys: a shipped method's from its config module (no torch),
    an objective registered elsewhere (a user's plug-in) from its registry entry. The name itself is the schema's."""
    name = c.get("solver.objective")
    declared = method_checks().get(("solver.objective", name))
    if declared is not None:
        c.errors.extend(declared(c.cfg))
    elif c.live is not None and name not in known_names("solver.objective") and name in c.live("solver.objective"):
        from score_lightning.step.solver_objective import SOLVER_OBJECTIVES

        c.errors.extend(SOLVER_OBJECTIVES.get(name).check(c.cfg))


def check_loss_variants(c: Checks) -> None:
    """Where ``optim.loss_type`` and its companions do not apply (the names themselves are the schema's: a
    registered plug-in is allowed and listed)."""
    loss_type = c.get("optim.loss_type")
    if c.get("solver.agent") != "mams" or loss_type not in c.registered("optim.loss_type"):
        per_row = []
    else:  # the losses' normalisers say which count sequences (a rule only MaMs meets: the registry is asked then)
        from score_lightning.step.loss_registry import POLICY_LOSSES

        per_row = [n for n, e in POLICY_LOSSES.items() if e.normaliser.counts_sequences]  # gspo, grpo_seq_mean
    if loss_type in per_row:
        per_token = ", ".join(n for n in POLICY_LOSSES.names() if n not in per_row)
        c.add(f"optim.loss_type={loss_type} with solver.agent=mams: it divides each sequence by its own length (gspo "
              "also takes its ratio and clip per sequence), and a MaMs trajectory is trained as one row per role "
              f"call, so its sequence would be one role call; set optim.loss_type to one of {per_token} (dr_grpo's "
              "constant is the whole trajectory's budget), or solver.agent=react")
    if not c.get("reward.overlong.enabled"):
        return
    cap, buf = c.get("solver.max_response_tokens"), c.get("reward.overlong.buffer_len")
    if buf is not None:
        c("reward.overlong.buffer_len", integer(1, cap if isinstance(cap, int) else None),
          f"null or an integer in [1, solver.max_response_tokens={cap}] (tokens before the cap where the penalty grows)")
    if c.get("solver.agent") == "mams":
        c.add("reward.overlong.enabled=true with solver.agent=mams: a MaMs trajectory is not cut at one length "
              "(each role call has its own budget, the report role's ends it), so there is no cap to put a buffer "
              "before; use solver.agent=react or reward.overlong.enabled=false")


def check_rollout_correction(c: Checks) -> None:
    """``optim.rollout_correction`` and its bounds; and no correction against vLLM's top-p-renormalised log-probs."""
    c("optim.rollout_correction", one_of("auto", *MODES), "auto, " + ", ".join(MODES))
    lo, hi = c.get("optim.rollout_correction_clip_min"), c.get("optim.rollout_correction_clip_max")
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and not lo < hi:
        c.add(f"optim.rollout_correction_clip_min={lo}: must be < optim.rollout_correction_clip_max={hi}")
    value, engine, top_p = c.get("optim.rollout_correction"), str(c.get("rollout.engine")), c.get("solver.top_p")
    if value in ("auto", *MODES) and engine == "vllm" and isinstance(top_p, (int, float)) and top_p < 1.0:
        mode = resolve_mode(value, engine)
        if mode != "none":
            c.add(f"optim.rollout_correction={value} ({mode}) with rollout=vllm and solver.top_p={top_p}: vLLM's "
                  "log-probs are renormalised over the top-p nucleus, so every ratio pi_old/mu would carry the kept "
                  "mass S (TRL #6789), not the engine-trainer gap; set solver.top_p=1.0 or "
                  "optim.rollout_correction=none")
