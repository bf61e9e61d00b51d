"""ARCO-style step credit (``reward.step=rubric``): the evaluator writes a rubric per search step and scores it."""
