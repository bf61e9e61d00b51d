"""RubricEM (``solver.agent=rubricem``, ``reward.step=stage``): plan, research, review and answer stages on a self-written rubric."""
