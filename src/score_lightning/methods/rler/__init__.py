"""RLER's evolving rubrics (``rubric=evolving``): a buffer of rubric items written, scored and pruned as the policy trains."""
