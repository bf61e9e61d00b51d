"""When an evaluation reached every report: read from its closed block, not from its last opener."""

from __future__ import annotations

from score_lightning.roles.evaluation import parse_evaluation
from score_lightning.roles.rubric import Rubric

RUBRIC = Rubric(("factual_support", "coverage"), (0.5, 0.5))


def _report(rid: int, close: bool = True) -> str:
    body = (f'<report id="{rid}"><scores><score dim="factual_support" value="7" reason="cited"/>'
            f'<score dim="coverage" value="4" reason="partial"/></scores>')
    return body + ("</report>" if close else "")


def test_a_closed_block_with_every_report_reaches_every_report():
    text = "<report_evaluations>" + _report(1) + _report(2) + "</report_evaluations>"
    ev = parse_evaluation(text, RUBRIC, 2)
    assert ev.valid and ev.closed and ev.reaches_every_report(2)


def test_an_unclosed_opener_past_k_does_not_undo_a_closed_block():
    text = "<report_evaluations>" + _report(1) + _report(2) + '<report id="3"></report_evaluations>'
    ev = parse_evaluation(text, RUBRIC, 2)
    assert ev.closed and ev.reaches_every_report(2) and ev.valid


def test_an_output_that_never_opens_the_block_reaches_nothing():
    text = _report(1) + _report(2)  # reports without <report_evaluations>
    ev = parse_evaluation(text, RUBRIC, 2)
    assert not ev.closed and not ev.reaches_every_report(2) and not ev.valid
    assert set(ev.reports) == {1, 2}  # still read, for the logs


def test_an_unclosed_block_or_report_is_incomplete():
    cut = "<report_evaluations>" + _report(1) + _report(2, close=False)
    assert not parse_evaluation(cut, RUBRIC, 2).reaches_every_report(2)
    open_block = "<report_evaluations>" + _report(1) + _report(2)
    ev = parse_evaluation(open_block, RUBRIC, 2)
    assert not ev.closed and not ev.reaches_every_report(2)
    missing = "<report_evaluations>" + _report(1) + "</report_evaluations>"
    assert not parse_evaluation(missing, RUBRIC, 2).reaches_every_report(2)
