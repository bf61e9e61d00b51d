"""ARCO's step credit (``reward.step=rubric``): its settings are the core's ``reward.step_*`` keys, so it declares
only the name it registers."""

#: the names it registers, by the config key that selects them (read before torch loads)
NAMES = {"reward.step": ("rubric",)}
