"""given: fixed per-query rubrics from a file (DeepResearch Bench criteria, DRB-II tasks, binary checklists)."""
