"""Parser for the evaluator's scoring output (one block per report, one score per rubric dimension).

Expected form (the evaluator may search and think before it)::

    <report_evaluations>
      <report id="1"><verification>...</verification><gap_analysis>...</gap_analysis>
        <scores><score dim="factual_support" value="7" reason="..."/>...</scores></report>
      ...
    </report_evaluations>

Rules, chosen so that a truncated or sloppy output is never rewarded as if it were complete:

* the *last* ``<report_evaluations>`` opening is used (earlier ones may sit in ``<think>``);
  a missing closing tag makes the whole parse invalid, but the reports present are still read;
* a report runs from ``<report id=N>`` to ``</report>`` (a missing close invalidates it);
  ids outside 1..K are ignored, a repeated id keeps the first and invalidates the parse;
* scores are read from the report's ``<scores>`` block (missing block or close: invalid);
  a value must be a plain number in 0..10, is stored as value/10 clipped to [0, 1], and an
  out-of-range or repeated value invalidates the report; dimensions not in the rubric are ignored;
* ``<verification>`` / ``<gap_analysis>`` count as present when closed and non-empty.

With ``evaluator.score_readout=expected`` the written values are replaced by the expected values read
while they were written (:func:`with_values`) before this parse, so both readouts share every rule above.

Parsing never raises; problems are reported in ``error`` (the first problem found).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from score_lightning.protocol import (
    EVALS_CLOSE,
    EVALS_OPEN,
    GAP_CLOSE,
    GAP_OPEN,
    REPORT_CLOSE,
    SCORES_CLOSE,
    SCORES_OPEN,
    VERIFICATION_CLOSE,
    VERIFICATION_OPEN,
)
from score_lightning.roles.rubric import ATTR_PATTERN, ATTR_RE, Rubric, parse_attributes, parse_number

_REPORT_OPEN_RE = re.compile(rf"<report((?:\s+{ATTR_PATTERN})*)\s*>")
_SCORE_RE = re.compile(rf"<score((?:\s+{ATTR_PATTERN})*)\s*/?>")

#: Scores are integers 0..10 in the prompt; decimals are accepted, anything outside is invalid.
SCORE_MAX = 10.0


@dataclass(frozen=True)
class ReportScores:
    report_id: int
    scores: dict[str, float]  # rubric dim -> value/10 clipped to [0, 1]
    has_verification: bool
    has_gap_analysis: bool
    valid: bool
    error: str
    closed: bool = True  # its </report> was written (False: the evaluation stopped inside it)


@dataclass(frozen=True)
class EvaluationParse:
    reports: dict[int, ReportScores] = field(default_factory=dict)  # report id (1..K) -> scores
    valid: bool = False
    error: str = ""
    closed: bool = False  # the <report_evaluations> block was closed

    def reaches_every_report(self, num_reports: int) -> bool:
        """The evaluation got to the end: its ``<report_evaluations>`` block is closed and every report 1..K
        has a closed ``<report>``. An opener past K (ignored by the parse) does not undo that; an output that
        never opened the block has not reached anything.

        An evaluation that stopped early (cut by its budget, or ended before the last report) says
        nothing about the reports it never reached; scoring them 0 would punish them for their place
        in the list (see ``step/evaluations.py``).
        """
        return self.closed and all(rid in self.reports and self.reports[rid].closed for rid in range(1, num_reports + 1))

    def score_matrix(self, rubric: Rubric, num_reports: int) -> list[list[float]]:
        """``[K][k]`` scores in rubric order; a missing report or dimension scores 0.0.

        Scores of reports that parsed but are invalid are kept; callers gate on validity.
        """
        rows = []
        for rid in range(1, num_reports + 1):
            rep = self.reports.get(rid)
            rows.append([rep.scores.get(d, 0.0) if rep is not None else 0.0 for d in rubric.dims])
        return rows


def with_values(text: str, values: Sequence[float]) -> str:
    """``text`` with the value of its i-th ``<score>`` tag replaced by ``values[i]`` (exactly: ``repr`` of the float).

    ``evaluator.score_readout=expected``: ``values`` are the expected values the decoder read at each score
    value, in the order written; under the scoring grammar no other text holds a ``<score`` tag. More values
    than tags: the last belong to a tag the turn was cut inside. Fewer: ``ValueError`` (the readout missed one).
    """
    tags = list(_SCORE_RE.finditer(text))
    if len(tags) > len(values):
        raise ValueError(f"evaluator.score_readout=expected: {len(tags)} <score> tags but {len(values)} expected "
                         "values were read (a tokenizer that merges the value with the text before it is not "
                         "supported: rollout/value_readout.py)")
    out, pos = [], 0
    for m, value in zip(tags, values):
        attr = next((a for a in ATTR_RE.finditer(m.group(1)) if a.group(1) == "value"), None)
        if attr is None:  # a tag without a value keeps it missing
            continue
        start, end = m.start(1) + attr.start(), m.start(1) + attr.end()
        out += [text[pos:start], f'value="{float(value)!r}"']
        pos = end
    return "".join(out) + text[pos:]


def _section(body: str, open_tag: str, close_tag: str) -> str | None:
    """Inner text of the first closed ``open_tag`` section, or ``None``."""
    start = body.find(open_tag)
    if start < 0:
        return None
    end = body.find(close_tag, start + len(open_tag))
    return None if end < 0 else body[start + len(open_tag) : end]


def _parse_scores(region: str, dims: tuple[str, ...]) -> tuple[dict[str, float], list[str]]:
    scores: dict[str, float] = {}
    errors: list[str] = []
    wanted = set(dims)
    for m in _SCORE_RE.finditer(region):
        attrs = parse_attributes(m.group(1))
        dim = attrs.get("dim", "").strip()
        if dim not in wanted:
            continue
        if dim in scores:
            errors.append(f"duplicate score for '{dim}'")
            continue
        raw = attrs.get("value", "")
        value = parse_number(raw)
        if value is None:
            errors.append(f"score {raw!r} for '{dim}' is not a number")
            continue
        if not 0.0 <= value <= SCORE_MAX:
            errors.append(f"score {value:g} for '{dim}' outside 0..10")
        scores[dim] = min(max(value / SCORE_MAX, 0.0), 1.0)
    errors.extend(f"missing score for '{d}'" for d in dims if d not in scores)
    return scores, errors


def _parse_report(
    rid: int, body: str, closed: bool, rubric: Rubric, require_verification: bool, require_gap_analysis: bool
) -> ReportScores:
    errors: list[str] = [] if closed else [f"missing {REPORT_CLOSE}"]
    verification = _section(body, VERIFICATION_OPEN, VERIFICATION_CLOSE)
    gap = _section(body, GAP_OPEN, GAP_CLOSE)
    has_ver = bool(verification and verification.strip())
    has_gap = bool(gap and gap.strip())
    if require_verification and not has_ver:
        errors.append(f"missing {VERIFICATION_OPEN}")
    if require_gap_analysis and not has_gap:
        errors.append(f"missing {GAP_OPEN}")
    start = body.find(SCORES_OPEN)
    if start < 0:
        errors.append(f"missing {SCORES_OPEN}")
        region = body
    else:
        end = body.find(SCORES_CLOSE, start)
        if end < 0:
            errors.append(f"missing {SCORES_CLOSE}")
            region = body[start:]
        else:
            region = body[start:end]
    scores, score_errors = _parse_scores(region, rubric.dims)
    errors.extend(score_errors)
    error = f"report {rid}: {errors[0]}" if errors else ""
    return ReportScores(rid, scores, has_ver, has_gap, valid=not errors, error=error, closed=closed)


def parse_evaluation(
    text: str,
    rubric: Rubric,
    num_reports: int,
    *,
    require_verification: bool = False,
    require_gap_analysis: bool = False,
) -> EvaluationParse:
    """Scores for reports 1..``num_reports``; valid only when all are present and valid. Never raises."""
    if not isinstance(text, str):
        return EvaluationParse({}, False, "not text")
    errors: list[str] = []
    closed = False
    start = text.rfind(EVALS_OPEN)
    if start < 0:
        errors.append(f"missing {EVALS_OPEN}")
        region = text
    else:
        region = text[start + len(EVALS_OPEN) :]
        end = region.find(EVALS_CLOSE)
        if end < 0:
            errors.append(f"missing {EVALS_CLOSE}")
        else:
            region, closed = region[:end], True

    reports: dict[int, ReportScores] = {}
    openers = list(_REPORT_OPEN_RE.finditer(region))
    for i, m in enumerate(openers):
        stop = openers[i + 1].start() if i + 1 < len(openers) else len(region)
        body = region[m.end() : stop]
        close = body.find(REPORT_CLOSE)
        report_closed = close >= 0
        if report_closed:
            body = body[:close]
        raw_id = parse_attributes(m.group(1)).get("id", "")  # data, not config
        rid_f = parse_number(raw_id)
        if rid_f is None or rid_f != int(rid_f):
            errors.append(f"report with bad id {raw_id!r}")
            continue
        rid = int(rid_f)
        if not 1 <= rid <= num_reports:
            continue
        if rid in reports:
            errors.append(f"duplicate report id {rid}")
            continue
        reports[rid] = _parse_report(rid, body, report_closed, rubric, require_verification, require_gap_analysis)

    for rid in range(1, num_reports + 1):
        rep = reports.get(rid)
        if rep is None:
            errors.append(f"missing report {rid}")
        elif not rep.valid:
            errors.append(rep.error)
    if num_reports < 1:
        errors.append(f"num_reports={num_reports} must be >= 1")
    return EvaluationParse(reports, valid=not errors, error=errors[0] if errors else "", closed=closed)
