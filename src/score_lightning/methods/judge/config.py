"""The external judge's switch: its settings are the core's ``judge`` group (the limits every external call
shares) and ``reward.citation_judge``, so it declares only the name it registers."""

#: the names it registers, by the config key that selects them (read before torch loads)
NAMES = {"evaluator.source": ("external",)}
