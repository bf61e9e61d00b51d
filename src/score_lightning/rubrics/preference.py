"""``evaluator.reward=preference``: a rubric is rewarded for ranking held-out preference pairs right.

Preference-trained rubric generators (GRPO on a hybrid reward) score a rubric by whether judging
with it agrees with human pairwise preferences, optionally mixed with an LLM's appraisal of the
rubric itself. Here, each step ``pairs_per_step`` pairs ``{"id", "prompt", "chosen", "rejected"}``
(JSONL, validated with ``file:line`` errors) are scored by the evaluator role with the step's rubric,
exactly as solver reports are (one scoring prompt per pair, report order alternating to cancel
position bias). The reward is the share of pairs whose chosen report scores higher (a tie counts
1/2), mixed as ``(1 - w) * agreement + w * appraisal / 10`` when ``appraisal_weight`` w > 0. A failed
appraisal (the endpoint's error, an unparsable reply) is counted (``appraisal_failures``) and that step's
reward is the agreement alone: a failure is never a grade of 0.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from score_lightning import distributed as D
from score_lightning.data.corpus import DataFormatError, iter_jsonl
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.engine import is_collective


def load_preferences(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, 0, "file not found")
    pairs = []
    for lineno, obj in iter_jsonl(path):
        for key in ("prompt", "chosen", "rejected"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise DataFormatError(path, lineno, f'needs a non-empty string "{key}" (fields: id, prompt, chosen, rejected)')
        pairs.append(obj)
    if not pairs:
        raise DataFormatError(path, 0, "no preference pairs in the file")
    return pairs


@dataclass
class PreferenceReward:
    path: str
    pairs_per_step: int = 2
    appraisal_weight: float = 0.0  # weight of the LLM appraisal in the hybrid reward (0: agreement only)
    appraisal: dict | None = None  # ChatClient settings for the appraiser (base_url, model, api_key_env, ...)
    seed: int = 0
    pairs: list[dict] = field(init=False)
    appraisal_failures: int = field(default=0, init=False)  # failed appraisals so far (logged)

    def __post_init__(self) -> None:
        self.pairs = load_preferences(self.path)
        self._client = None
        if self.appraisal_weight > 0:
            from score_lightning.clients.chat import ChatClient

            ext = dict(self.appraisal or {})
            key_env = ext.pop("api_key_env", "OPENAI_API_KEY")
            self._client = ChatClient(api_key=os.environ.get(key_env) if key_env else None, **ext)

    def reward(self, step: int, rubric: Rubric, score_pairs, engine=None) -> float:
        """The step's preference reward (collective: rank 0 scores, or every rank with a collective engine).

        ``score_pairs(prompts, report_pairs) -> list[[2][k] scores]`` runs the evaluator's scoring on ``engine``
        (under ``evaluator.scoring``: one evaluation of the pair, or one per report) and returns each pair's scores.
        """
        rng = random.Random(f"{self.seed}-{step}")
        chosen = rng.sample(self.pairs, min(self.pairs_per_step, len(self.pairs)))
        value = None
        if D.rank() == 0 or is_collective(engine):
            flips = [i % 2 == 1 for i in range(len(chosen))]  # alternate positions: no position bias
            groups = [[p["rejected"], p["chosen"]] if f else [p["chosen"], p["rejected"]] for p, f in zip(chosen, flips)]
            matrices = score_pairs([p["prompt"] for p in chosen], groups)
            agree = []
            for rows, flip in zip(matrices, flips):
                parts = [sum(w * s for w, s in zip(rubric.weights, row)) for row in rows]
                good, bad = (parts[1], parts[0]) if flip else (parts[0], parts[1])
                agree.append(1.0 if good > bad else 0.5 if good == bad else 0.0)
            value = sum(agree) / len(agree)
            grade = self._appraise(rubric, chosen[0]) if self._client is not None else None
            if grade is not None:
                value = (1 - self.appraisal_weight) * value + self.appraisal_weight * grade
            elif self._client is not None:
                self.appraisal_failures += 1
        return float(D.broadcast_object(value))

    def _appraise(self, rubric: Rubric, pair: dict) -> float | None:
        """An LLM's 0-10 grade of the rubric for this kind of question, as a fraction (None: it failed)."""
        lines = "\n".join(f"- {d} ({w:.2f}): {t}" for d, w, t in zip(rubric.dims, rubric.weights,
                                                                      rubric.texts or rubric.dims))
        msgs = [{"role": "system", "content": "You grade rubrics for judging research reports. Reply with one "
                                              "integer 0-10 only."},
                {"role": "user", "content": f"Question: {pair['prompt']}\n\nRubric:\n{lines}\n\nGrade (0-10):"}]
        outcome = self._client.ask(msgs, lambda t: min(10.0, max(0.0, float(t.strip().split()[0]))))
        return outcome.value / 10.0 if outcome.ok else None
