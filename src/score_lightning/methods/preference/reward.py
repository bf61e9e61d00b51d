"""``evaluator.reward=preference``: a rubric is rewarded for ranking held-out preference pairs right.

Preference-trained rubric generators (GRPO on a hybrid reward) score a rubric by whether judging
with it agrees with human pairwise preferences, optionally mixed with an LLM's appraisal of the
rubric itself. Here, each step ``pairs_per_step`` pairs ``{"id", "prompt", "chosen", "rejected"}``
(JSONL, validated with ``file:line`` errors) are scored by the evaluator role with the step's rubric,
exactly as solver reports are (one scoring prompt per pair, report order alternating to cancel
position bias). The reward is the share of pairs whose chosen report scores higher (a tie counts
1/2), over the pairs whose evaluation finished: an evaluation cut before a report says nothing about it (a missing
score read as 0 would make the agreement depend on which report came first), so that pair is left out and counted
(``evaluator/preference_incomplete_rate``); a step with no finished pair gives no reward. It is mixed as ``(1 - w) * agreement + w * appraisal / 10`` when ``appraisal_weight`` w > 0. A failed
appraisal (the endpoint's error, an unparsable reply) is counted (``appraisal_failures``) and that step's
reward is the agreement alone: a failure is never a grade of 0. The pairs a step draws are seeded by the run's
``seed`` and the step, so two seeds draw differently and a resumed run draws the same.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from score_lightning import distributed as D
from score_lightning.data.corpus import DataFormatError, iter_jsonl
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.engine import is_collective


#: a pair's ``split`` (absent: train): training draws only ``train`` pairs; ``val`` and ``test`` are held out
PAIR_SPLITS = ("train", "val", "test")


def load_preferences(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, 0, "file not found")
    pairs = []
    for lineno, obj in iter_jsonl(path):
        for key in ("prompt", "chosen", "rejected"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise DataFormatError(path, lineno, f'needs a non-empty string "{key}" (fields: id, prompt, chosen, rejected)')
        split = obj.get("split", "train")  # data, not config
        if split not in PAIR_SPLITS:
            raise DataFormatError(path, lineno, f'"split" must be one of {PAIR_SPLITS}, got {split!r}')
        pairs.append(obj)
    if not any(p.get("split", "train") == "train" for p in pairs):  # data, not config
        raise DataFormatError(path, 0, "no training preference pairs in the file (lines without \"split\" or with "
                                       "\"split\": \"train\")")
    return pairs


@dataclass
class PreferenceReward:
    path: str
    pairs_per_step: int = 2
    appraisal_weight: float = 0.0  # weight of the LLM appraisal in the hybrid reward (0: agreement only)
    appraisal: dict | None = None  # ChatClient settings for the appraiser (base_url, model, api_key_env, ...)
    seed: int = 0  # the run's seed (``seed``): with the step, what the pair draw is seeded by
    group_size: int = 4  # G >= 2: G rubrics per pair, written for its question, trained by GRPO; 1: the step's rubric
    pairs: list[dict] = field(init=False)
    appraisal_failures: int = field(default=0, init=False)  # failed appraisals so far (logged)
    scored: int = field(default=0, init=False)  # this step's pair evaluations
    incomplete: int = field(default=0, init=False)  # ... of which did not finish: left out of the reward (logged)

    def __post_init__(self) -> None:
        if int(self.group_size) < 1:
            raise ValueError(f"evaluator.preference.group_size={self.group_size}: an integer >= 1")
        self.pairs = [p for p in load_preferences(self.path) if p.get("split", "train") == "train"]  # data, not config
        self._client = None
        if self.appraisal_weight > 0:
            from score_lightning.clients.chat import ChatClient

            ext = dict(self.appraisal or {})
            key_env = ext.pop("api_key_env", "OPENAI_API_KEY")
            self._client = ChatClient(api_key=os.environ.get(key_env) if key_env else None, **ext)

    def reward(self, step: int, rubric: Rubric, score_pairs, engine=None) -> float:
        """The step's preference reward (collective: rank 0 scores, or every rank with a collective engine).

        ``score_pairs(prompts, report_pairs) -> list[[2][k] scores | None]`` runs the evaluator's scoring on
        ``engine`` (under ``evaluator.scoring``: one evaluation of the pair, or one per report) and returns each
        pair's scores, ``None`` for a pair whose evaluation did not finish (left out, counted). NaN: no pair finished.
        """
        chosen = self.choose(step)
        out = None
        if D.rank() == 0 or is_collective(engine):
            flips = [i % 2 == 1 for i in range(len(chosen))]  # alternate positions: no position bias
            matrices = score_pairs([p["prompt"] for p in chosen], [ordered(p, f) for p, f in zip(chosen, flips)])
            agree = [agreement(rubric, rows, flip) for rows, flip in zip(matrices, flips) if rows is not None]
            value = self.hybrid(sum(agree) / len(agree), rubric, chosen[0]) if agree else math.nan
            out = (value, len(matrices), len(matrices) - len(agree), self.appraisal_failures)
        value, self.scored, self.incomplete, self.appraisal_failures = D.broadcast_object(out)
        return float(value)

    @property
    def incomplete_rate(self) -> float:
        """The step's share of pair evaluations that did not finish (NaN before any)."""
        return self.incomplete / self.scored if self.scored else math.nan

    def choose(self, step: int) -> list[dict]:
        """The step's training pairs (seeded by the step, so a resumed run draws the same)."""
        rng = random.Random(f"{self.seed}-{step}")
        return rng.sample(self.pairs, min(self.pairs_per_step, len(self.pairs)))

    def hybrid(self, agree: float, rubric: Rubric, pair: dict) -> float:
        """(1 - w) agreement + w appraisal with an appraiser; the agreement alone when its appraisal failed."""
        if self._client is None:
            return agree
        grade = self._appraise(rubric, pair)
        if grade is None:
            self.appraisal_failures += 1
            return agree
        return (1 - self.appraisal_weight) * agree + self.appraisal_weight * grade

    def _appraise(self, rubric: Rubric, pair: dict) -> float | None:
        """An LLM's 0-10 grade of the rubric for this kind of question, as a fraction (None: it failed)."""
        lines = "\n".join(f"- {d} ({w:.2f}): {t}" for d, w, t in zip(rubric.dims, rubric.weights,
                                                                      rubric.texts or rubric.dims))
        msgs = [{"role": "system", "content": "You grade rubrics for judging research reports. Reply with one "
                                              "integer 0-10 only."},
                {"role": "user", "content": f"Question: {pair['prompt']}\n\nRubric:\n{lines}\n\nGrade (0-10):"}]
        outcome = self._client.ask(msgs, lambda t: min(10.0, max(0.0, float(t.strip().split()[0]))))
        return outcome.value / 10.0 if outcome.ok else None


def ordered(pair: dict, flip: bool) -> list[str]:
    """The pair's two reports in scoring order: chosen first, or rejected first when ``flip``."""
    return [pair["rejected"], pair["chosen"]] if flip else [pair["chosen"], pair["rejected"]]


def agreement(rubric: Rubric, rows, flip: bool) -> float:
    """1 when the chosen report's rubric-weighted score is higher, 1/2 on a tie, else 0."""
    parts = [sum(w * s for w, s in zip(rubric.weights, row)) for row in rows]
    good, bad = (parts[1], parts[0]) if flip else (parts[0], parts[1])
    return 1.0 if good > bad else 0.5 if good == bad else 0.0
