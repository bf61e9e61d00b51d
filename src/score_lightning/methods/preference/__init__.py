"""Preference-trained rubric writers (``evaluator.reward=preference``): rubrics earn the pairs they order right."""
