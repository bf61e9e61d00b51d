"""Test helpers: compose the real Hydra config with overrides, and read TensorBoard scalars."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]

#: overrides that shrink tiny_score to seconds per step while keeping every phase active
FAST = [
    "experiment=tiny_score",
    "sft.enabled=false",
    "optim.ppo_epochs=1",
    "solver.num_rollouts=2",
    "data.batch_size=1",
    "optim.mini_batch_size=1",
    "optim.micro_batch_size=2",
    "solver.max_response_tokens=40",
    "solver.max_tool_calls=1",
    "evaluator.max_response_tokens=40",
    "evaluator.max_rubric_tokens=24",
    "evaluator.max_tool_calls=1",
    "trainer.enable_progress_bar=false",
    "callbacks.collapse_guard.enabled=false",
]


def plain_grpo(**changes) -> dict:
    """GRPOSettings' switches as a hand-computed update test wants them, off unless ``changes`` says (the settings
    have no defaults of their own: a run's come from its config): no shared-prompt forward, no engine-trainer
    correction, the token-mean ``grpo`` loss, group scaling, no length cap, no masking, no overlong shaping."""
    from score_lightning.step.rollout_correction import RolloutCorrection

    return {"share_prompt": False, "correction": RolloutCorrection(), "loss_type": "grpo", "scale_rewards": "group",
            "max_response_tokens": 0, "mask_truncated": False, "overlong": None, **changes}


def compose(overrides: list[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from score_lightning.launch.schema import register_schema

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=overrides)


def train(overrides: list[str]) -> dict:
    """A run in this process, as ``src/train.py`` would run these overrides (its command-line checks are tested
    on the CLI elsewhere): the run's final metrics. In process, a mode's few steps skip the interpreter start and
    the imports a subprocess pays (about 6 s of each CLI run on 2 cores)."""
    from score_lightning.launch.training import run

    return run(compose(overrides))


def read_scalars(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(Path(logdir).rglob("events.out.tfevents.*")):
        ea = EventAccumulator(str(events), size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in ea.Scalars(tag))
    return out



class RecordingCallback(Callback):
    """A user's own callback, added to a run only by ``+callbacks.mine._target_=helpers.RecordingCallback``."""

    batch_ends: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        RecordingCallback.batch_ends.append(int(pl_module.score_step))


def process_alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a reaped or exited worker is not alive)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def flat_config(cfg) -> dict:
    """A composed config as ``{"dotted.key": value}`` (interpolations unresolved): what two recipes differ in."""
    from omegaconf import OmegaConf

    out: dict = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return out


def refusal(overrides: list[str]) -> str:
    """The ``error: invalid config:`` block ``python src/train.py <overrides>`` prints: the command line's checks
    (types, unknown keys, ranges; then every rule), else the rules the run checks on the composed config."""
    from score_lightning.errors import ConfigError
    from score_lightning.launch.config_check import check_command_line
    from score_lightning.launch.config_validation import validate_config

    try:
        check_command_line(overrides)
        validate_config(compose(overrides))
    except ConfigError as exc:
        return str(exc)
    raise AssertionError(f"not refused: {overrides}")


#: the GPU recipes' required inputs (data=query_file, retriever=http), given as the embedded queries and a loopback URL
GPU_RECIPES = ("qwen_score", "llama_score", "qwen_score_1gpu")
INPUTS = ["data.queries_path=null", "retriever.url=http://127.0.0.1:8000/retrieve"]


def recipe(name: str) -> list[str]:
    """``experiment=<name>``, with the inputs a GPU recipe requires (their refusal: tests/test_newcomer_refusals.py)."""
    return [f"experiment={name}", *(INPUTS if name in GPU_RECIPES else [])]


def spawn_ranks(fn, args: tuple, results: list[Path], timeout_s: float = 300.0, exit_grace_s: float = 30.0) -> None:
    """Run ``fn(rank, *args)`` in one spawned process per entry of ``results`` and wait, bounded.

    Why not ``mp.spawn(join=True)``: its join has no deadline, and a rank that has written its result can stay
    asleep at exit (a DDP model freed after its process group sleeps in its destructor: free it before
    ``destroy_process_group``, as ``test_dpo_objective._ddp_rank`` does), holding the stage until CI's limit.
    Here a rank still alive ``exit_grace_s`` after every result file exists is killed, with a warning (its work
    is done and on disk); a rank that wrote nothing within ``timeout_s`` fails the test by number, and a rank
    that raised fails it with its traceback, as ``mp.spawn`` does."""
    import time
    import warnings

    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=args, nprocs=len(results), join=False, start_method="spawn")
    start, written_at = time.monotonic(), None
    try:
        while not ctx.join(timeout=0.5):  # raises ProcessRaisedException / ProcessExitedException as mp.spawn
            now = time.monotonic()
            if written_at is None and all(p.exists() for p in results):
                written_at = now
            if written_at is not None and now - written_at > exit_grace_s:
                stuck = [r for r, proc in enumerate(ctx.processes) if proc.is_alive()]
                warnings.warn(f"ranks {stuck} still alive {exit_grace_s:.0f} s after every result was written: reaped")
                return  # every result is on disk; the finally below reaps them
            if now - start > timeout_s:
                missing = [r for r, p in enumerate(results) if not p.exists()]
                raise AssertionError(f"ranks {missing} wrote no result within {timeout_s:.0f} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
