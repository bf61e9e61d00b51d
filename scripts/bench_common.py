"""Shared pieces of the benchmarks: the real Hydra config, the tiny checkpoint, the fixed prompts and
reward, and a line protocol for worker subprocesses (one per side, so peak RSS is per side).

Everything here is deterministic: the same checkpoint (built exactly as ``tests/conftest.py`` builds
it), the same embedded queries through the solver chat template, and a reward that is a pure
function of the completion text.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SCORE_LIGHTNING_CACHE", ROOT / ".cache" / "test"))
os.environ.setdefault("SCORE_LIGHTNING_CACHE", str(CACHE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

#: keywords the fixed reward counts; any deterministic function of the text would do
KEYWORDS = ("the", "json", "python", "module", "file", "data", "<answer>", "</answer>")


def compose(overrides: list[str]):
    """The project's real Hydra config (``configs/train.yaml``) with overrides, as the tests compose it."""
    from score_lightning.launch.schema import compose_config

    return compose_config(overrides, ROOT / "configs")


def tiny_checkpoint() -> Path:
    """The tests' cached tiny checkpoint; built (once, then cached) exactly as the conftest fixture does."""
    from score_lightning.data.corpus import default_corpus_path
    from score_lightning.policy.models import TinyModelSpec, ensure_tiny_checkpoint
    from score_lightning.launch.training import tokenizer_extra_texts

    CACHE.mkdir(parents=True, exist_ok=True)
    corpus = default_corpus_path(CACHE / "corpus")
    return ensure_tiny_checkpoint(CACHE / "models", TinyModelSpec(), corpus, tokenizer_extra_texts())


def checkpoint(model: str = "tiny") -> Path:
    """``tiny``: the tests' checkpoint; a preset (``smollm2_135m``) or a directory: as ``training.resolve_model_arg``."""
    if model == "tiny":
        return tiny_checkpoint()
    from score_lightning.launch.training import resolve_model_arg

    return Path(resolve_model_arg(model, CACHE))


def set_malloc(cfg) -> str:
    """The trainer's glibc mmap threshold (``trainer.malloc_mmap_threshold_mb``) in this process; what was set."""
    from omegaconf import OmegaConf

    from score_lightning.launch.cpu_memory import set_malloc_mmap_threshold

    mb = OmegaConf.select(cfg, "trainer.malloc_mmap_threshold_mb")
    return f"mmap threshold {mb} MB" if set_malloc_mmap_threshold(mb) else "glibc default"


def bench_queries(n: int) -> list[str]:
    from score_lightning.data.queries import load_queries

    qs = load_queries(None)
    if n > len(qs):
        raise ValueError(f"--prompts {n} > {len(qs)} embedded queries")
    return [q.prompt for q in qs[:n]]


def solver_chat(queries: list[str], cfg) -> list[list[dict]]:
    """The single-turn solver messages ``step.rollouts.solver_rollouts`` builds (static fallback rubric, no tools)."""
    from omegaconf import OmegaConf

    from score_lightning.harness.state import HarnessState
    from score_lightning.roles.prompts import solver_messages
    from score_lightning.roles.rubric import fallback_rubric

    state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    rubric = fallback_rubric(state)
    return [solver_messages(q, rubric, state, int(cfg.solver.max_tool_calls), bool(cfg.solver.conclusion_line))
            for q in queries]


def reward_of_ids(tokenizer, ids) -> float:
    """The fixed reward of a completion, from its token ids decoded the same way on both sides."""
    return reward_of_text(tokenizer.decode(list(ids)))


def reward_of_text(text: str) -> float:
    """Fixed, deterministic reward of a completion's text: keyword hits plus a capped length term."""
    low = text.lower()
    hits = sum(low.count(k) for k in KEYWORDS)
    words = len(low.split())
    return float(hits) + 0.02 * min(words, 50) + 0.001 * (len(set(low)) % 17)


def ids_digest(rows: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps([list(map(int, r)) for r in rows]).encode()).hexdigest()[:16]


def unique_rows(rows) -> list[list[int]]:
    """Distinct rows in order of first appearance (the K copies of a prompt collapse to one)."""
    seen, out = set(), []
    for r in rows:
        key = tuple(int(x) for x in r)
        if key not in seen:
            seen.add(key)
            out.append(list(key))
    return out


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def reset_peak_rss() -> None:
    """Reset this process's peak RSS (Linux ``VmHWM``) to its current RSS, so a later
    :func:`peak_rss_since_reset_mb` covers only what ran in between (model loading excluded)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_since_reset_mb() -> float:
    """``VmHWM`` from ``/proc/self/status``: the peak RSS since the last :func:`reset_peak_rss`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def machine_line() -> str:
    """CPU count and model, RAM, and the versions that matter, for the benchmark record."""
    import platform

    import torch
    import transformers

    from score_lightning.glue.environment import cpu_model

    model = cpu_model() or "unknown CPU"
    try:
        import psutil

        ram = f"{psutil.virtual_memory().total / 2**30:.1f} GiB RAM"
    except ImportError:  # pragma: no cover
        ram = "RAM unknown"
    try:
        import trl

        trl_v = trl.__version__
    except ImportError:
        trl_v = "not installed"
    return (f"machine: {os.cpu_count()} CPUs ({model}), {ram}; python {platform.python_version()}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl_v}")


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs: list[float]) -> str:
    """``min–max`` of a list of seconds, for the tables."""
    return f"{min(xs):.3f}–{max(xs):.3f}" if xs else "-"


def load_line() -> str:
    """The 1/5/15-minute load average: on a shared machine, absolute times only compare within one run."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} CPUs"


def summary_line(**values: Any) -> str:
    """The one parseable last line of a benchmark: ``key=value`` pairs separated by spaces.

    A float is printed with 3 decimals; ``None`` prints ``refused``: the equal-work checks failed, so
    no ratio is given.
    """
    def fmt(v: Any) -> str:
        return "refused" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v).replace(" ", "_"))

    return " ".join(f"{k}={fmt(v)}" for k, v in values.items())


def alternate(workers: dict[str, "Worker"], n_steps: int, warmup: int, show=None) -> dict[str, list[dict]]:
    """Step two workers in turns, A B B A A B ...: only one computes at a time, and neither always goes first.

    Returns each worker's step records, with ``rep`` = index after the warm-up (negative while warming up).
    ``show(name, tag, record)`` prints a progress line.
    """
    names = list(workers)
    steps: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(n_steps):
        for name in names if i % 2 == 0 else names[::-1]:
            r = workers[name].step()
            r["rep"] = i - warmup
            steps[name].append(r)
            if show is not None:
                show(name, "warm-up" if i < warmup else f"rep {i - warmup + 1}/{n_steps - warmup}", r)
    return steps


def bench_env() -> dict:
    """The environment of a worker subprocess: offline hub, quiet tokenizers and warnings."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def set_threads(threads: int) -> None:
    """``threads`` torch threads in this process (0: torch's default)."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


class Proto:
    """JSON lines between the parent (stdin/stdout pipes) and a worker.

    The worker keeps a private duplicate of its original stdout for the protocol and points fd 1 at
    stderr, so library prints cannot corrupt the stream.
    """

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._in = sys.stdin

    def send(self, kind: str, **payload: Any) -> None:
        self._out.write(json.dumps({"kind": kind, **payload}) + "\n")
        self._out.flush()

    def recv(self) -> str:
        line = self._in.readline()
        if not line:
            raise SystemExit("parent closed the pipe")
        return line.strip()

    def wait_go(self) -> str:
        """Block until the parent's next command: ``step`` (run one) or ``finish`` (after the last step)."""
        cmd = self.recv()
        if cmd not in ("step", "finish"):
            raise SystemExit(f"unknown command {cmd!r}")
        return cmd


class Worker:
    """Parent side of one worker subprocess."""

    def __init__(self, argv: list[str], name: str, env: dict | None = None):
        import subprocess
        import tempfile

        self.name = name
        # the worker's stderr (library chatter, tracebacks) goes to a file, shown if the worker fails
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench_{name}_", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1, env=env, cwd=str(ROOT))

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            tail = Path(self.log.name).read_text(errors="replace").splitlines()[-40:]
            sys.stderr.write("\n".join(tail) + "\n")
            raise RuntimeError(f"worker {self.name} exited (rc={rc}) without a reply; its log: {self.log.name}")
        return json.loads(line)

    def expect(self, kind: str) -> dict:
        msg = self.read()
        if msg.get("kind") != kind:
            raise RuntimeError(f"worker {self.name}: expected {kind!r}, got {msg}")
        return msg

    def _send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def step(self) -> dict:
        self._send("step")
        return self.expect("step")

    def finish(self) -> dict:
        """After the last step: let the worker's loop end (teardown runs only now, overlapping nothing)."""
        self._send("finish")
        msg = self.expect("done")
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        return msg

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
