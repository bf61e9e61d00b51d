"""The static-evaluator baseline: an external LLM judge (``evaluator.source=external``, the ``judge`` group) scores
each report, and DR Tulu's citation reward asks the same judge (``reward.citation_judge``).

``client.py`` sends the judgements; ``scoring.py`` and ``citation.py`` register the evaluator source and the reward
term (``plugin.py`` imports them). The limits every external call shares, and the check that stops a step with too
many failed judgements, are the core's (``clients/limiter.py``, ``step/faults.py``).
"""
