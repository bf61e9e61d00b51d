"""How well a checkpoint fits fresh scoring demonstrations, teacher-forced, split by report quality.

A cold start whose sampled scores do not separate good reports from bad ones (``scripts/probe_scoring.py``)
can fail at two different places, and this tells them apart:

* **the score itself**: given the demo's own ``<verification>`` text before it (which already says "No
  report.", "No citations.", "[id] found by search."), does the model predict the demo's value? Measured as
  the model's expected value over the digit tokens at each ``value="`` position, per report kind;
* **reading the report**: at the start of a report's ``<verification>``, does the model's greedy choice of
  the next two tokens match the demo's? That text depends on what report i in the prompt looks like
  (missing, uncited, cited), so a model that cannot find report i writes the commonest opening instead.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict

import torch

from score_lightning import protocol as P
from score_lightning.sft.context import DemoContext
from score_lightning.sft.scoring_demos import scoring_group

_REPORT_RE = re.compile(r'<report id="(\d+)">')


@torch.no_grad()
def scoring_demo_fit(model, tokenizer, ctx: DemoContext, n_demos: int, seed: int = 12345) -> dict[str, dict[str, float]]:
    """Per report kind: ``n_values``, ``target_value`` (mean demo value), ``model_value`` (mean expected value
    under the model, teacher-forced), ``n_verifications`` and ``verification_start_acc`` (greedy next two
    tokens at the start of ``<verification>`` equal the demo's). Demos come from ``seed``, not the training seed."""
    digits = [tokenizer.convert_tokens_to_ids(str(i)) for i in range(10)]
    unk = getattr(tokenizer, "unk_token_id", None)
    if any(d is None or d == unk for d in digits):
        raise ValueError("the tokenizer has no single-token digits 0-9: value positions cannot be read")
    digit_of = {t: i for i, t in enumerate(digits)}
    weights = torch.arange(10, dtype=torch.float32)
    values: dict[str, list[tuple[int, float]]] = defaultdict(list)
    starts: dict[str, list[bool]] = defaultdict(list)
    rng = random.Random(seed)
    built = tries = 0
    while built < n_demos and tries < 10 * n_demos + 10:
        tries += 1
        demos = scoring_group(ctx, random.Random(rng.random()), rng.choice(ctx.queries), 1)
        if not demos:
            continue
        d = demos[0]
        built += 1
        ids = torch.tensor([d.prompt_ids + d.response_ids])
        logits = model(ids).logits[0].float()
        base, resp, kinds = len(d.prompt_ids), d.response_ids, d.meta["kinds"]
        prefix = [tokenizer.decode(resp[:i]) for i in range(len(resp))]
        for i, text in enumerate(prefix):
            reports = _REPORT_RE.findall(text)
            if not reports:
                continue
            kind = kinds[int(reports[-1]) - 1]
            row = logits[base + i - 1]  # the distribution over response token i
            if text.endswith('value="') and resp[i] in digit_of:
                p = row[digits].softmax(-1)
                values[kind].append((digit_of[resp[i]], float((p * weights).sum())))
            elif text.endswith(P.VERIFICATION_OPEN) and i + 1 < len(resp):
                ok = int(row.argmax()) == resp[i] and int(logits[base + i].argmax()) == resp[i + 1]
                starts[kind].append(ok)
    out: dict[str, dict[str, float]] = {}
    for kind in sorted(set(values) | set(starts)):
        v, s = values.get(kind, []), starts.get(kind, [])
        out[kind] = {
            "n_values": float(len(v)),
            "target_value": sum(t for t, _ in v) / len(v) if v else float("nan"),
            "model_value": sum(m for _, m in v) / len(v) if v else float("nan"),
            "n_verifications": float(len(s)),
            "verification_start_acc": sum(s) / len(s) if s else float("nan"),
        }
    return out
