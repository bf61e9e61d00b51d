"""The rule reward's switch: its settings are the core's ``reward.rule_quality`` and ``reward.items_path``, so it
declares only the name it registers."""

#: the names it registers, by the config key that selects them (read before torch loads)
NAMES = {"reward.source": ("rule",)}
