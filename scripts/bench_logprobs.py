"""Peak memory and time of the trainer's log-prob pass at a real vocabulary: plain vs fused vs TRL.

    HF_HUB_OFFLINE=1 python scripts/bench_logprobs.py [--rows 2] [--prompt 64] [--response 2048] [--reps 3]

Model: a random-weight ``Qwen2ForCausalLM`` with Qwen2.5's vocabulary (151,936), hidden 256, 2 layers,
4 heads (head_dim 64), untied head, float32. Batch: ``--rows`` rows of ``--prompt`` prompt tokens and
``--response`` response tokens (random ids, seeded), response tokens in the loss.

Work, identical in every variant: one forward with gradient giving per-token log-probs and the
entropy (a logged statistic, no gradient), then backward of a fixed random weighting of the response
log-probs (a stand-in for the GRPO surrogate; all parameters get gradients).

- ``plain``: ``policy_logprobs(..., fused=False)``: the response positions' ``[rows, T, V]`` logits;
- ``fused``: ``policy_logprobs(...)``, the training default: ``logprobs.HeadLogprobs`` in position chunks;
- ``trl``: TRL's own fused LM head (``trl.trainer.utils.add_fused_lm_head``, what ``GRPOTrainer`` calls,
  with ``outputs=("log_probs", "entropy")``) on the same model and batch. On CPU it scores every
  position, prompt included (``--prompt`` more per row than ours).

Each variant runs in a fresh subprocess (one torch thread). "Extra" is the peak RSS of the measured
passes (Linux ``VmHWM``, reset right before them) minus the RSS at that moment: the model, the batch
and a small warm-up pass are already resident and not counted. Equal work is checked: the three
must agree on the summed response log-prob and on the LM head's gradient norm (relative 1e-4),
else no ratio is printed. The last line is
``logprob_peak_ratio_vs_plain=X logprob_peak_ratio_vs_trl=Y equal_work=ok`` (fused extra / other extra).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc  # noqa: E402

VOCAB = 151_936
VARIANTS = ("plain", "fused", "trl")


def big_vocab_model(hidden: int = 256, layers: int = 2, seed: int = 0):
    """A random-weight Qwen2 with a real 152k vocabulary (the shape that decides log-prob memory)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128),
                      max_position_embeddings=8192, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).float()


def _batch(rows: int, prompt: int, response: int, seed: int = 1):
    import torch

    from score_lightning.step.batching import build_token_batch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, prompt + response), generator=g).tolist()
    return build_token_batch([r[:prompt] for r in ids], [r[prompt:] for r in ids], [[1] * response] * rows, pad_id=0)


def _pass(model, batch, variant: str, weights):
    """One forward (log-probs + detached entropy) and backward; returns (summed response log-prob, head grad norm)."""
    import torch

    from score_lightning.step.batching import policy_logprobs

    model.zero_grad(set_to_none=True)
    if variant == "trl":
        labels = batch.input_ids.masked_fill(torch.nn.functional.pad(batch.loss_mask, (1, 0)) == 0, -100)
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels, fused_lm_head=True)
        logp = out.log_probs
    else:
        logp, _ = policy_logprobs(model, batch, 1.0, with_entropy=True, fused=variant == "fused")
    loss = (logp * batch.loss_mask * weights).sum()
    loss.backward()
    return float((logp.detach() * batch.loss_mask).sum()), float(model.lm_head.weight.grad.norm())


def worker(a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    model = big_vocab_model()
    if a.worker == "trl":
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
    batch = _batch(a.rows, a.prompt, a.response)
    weights = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(2))
    _pass(model, _batch(1, 4, 16), a.worker, torch.ones(1, 19))  # warm-up: allocator, kernels, lazy imports
    before = bc.rss_mb()
    bc.reset_peak_rss()
    times, check = [], None
    for _ in range(a.reps):
        t0 = time.perf_counter()
        check = _pass(model, batch, a.worker, weights)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"variant": a.worker, "rss_before_mb": before, "peak_rss_mb": bc.peak_rss_since_reset_mb(),
                      "times": times,
                      "logp_sum": check[0], "head_grad_norm": check[1], "load": bc.load_line()}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--response", type=int, default=2048)
    p.add_argument("--reps", type=int, default=3, help="timed passes per variant (peak RSS is over all of them)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    print(bc.machine_line(), flush=True)
    print(f"before: {bc.load_line()}", flush=True)
    res = {}
    for v in VARIANTS:
        cmd = [sys.executable, __file__, "--worker", v] + [f"--{k}={getattr(a, k)}" for k in
                                                           ("rows", "prompt", "response", "reps", "threads")]
        out = subprocess.run(cmd, capture_output=True, text=True, env=bc.bench_env(), cwd=str(bc.ROOT))
        if out.returncode != 0:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit(f"variant {v} failed (rc={out.returncode})")
        res[v] = json.loads(out.stdout.strip().splitlines()[-1])
        res[v]["extra_mb"] = res[v]["peak_rss_mb"] - res[v]["rss_before_mb"]
        print(f"  {v}: extra {res[v]['extra_mb']:.0f} MiB, median {bc.median(res[v]['times']):.2f} s; "
              f"{res[v]['load']}", flush=True)
    print(f"\nlog-prob forward + backward, random Qwen2 (V={VOCAB:,}, hidden 256, 2 layers), {a.rows} rows x "
          f"({a.prompt} prompt + {a.response} response) tokens, float32, {a.threads} thread(s), {a.reps} passes\n")
    print("| variant | extra peak RSS (MiB) | peak RSS (MiB) | median pass (s) | min–max (s) | summed log-prob "
          "| head grad norm |")
    print("|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        r = res[v]
        print(f"| {v} | {r['extra_mb']:.0f} | {r['peak_rss_mb']:.0f} | {bc.median(r['times']):.2f} "
              f"| {bc.spread(r['times'])} | {r['logp_sum']:.4f} | {r['head_grad_norm']:.6f} |")
    ref = res["plain"]
    problems = [f"{v}: {key} {res[v][key]!r} vs plain {ref[key]!r}" for v in VARIANTS for key in
                ("logp_sum", "head_grad_norm") if abs(res[v][key] - ref[key]) > 1e-4 * max(1.0, abs(ref[key]))]
    print("equal work: " + ("summed log-probs and head gradient norms agree (rel. 1e-4)" if not problems
                            else "FAILED\n  " + "\n  ".join(problems)))
    print(f"after: {bc.load_line()}")
    ok = not problems
    fused = res["fused"]["extra_mb"]
    print(bc.summary_line(logprob_peak_ratio_vs_plain=fused / ref["extra_mb"] if ok else None,
                          logprob_peak_ratio_vs_trl=fused / res["trl"]["extra_mb"] if ok else None,
                          equal_work="ok" if ok else "FAILED"))
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
