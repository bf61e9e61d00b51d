"""MaMs (``solver.agent=mams``): one policy as search / state / report roles with bounded prompts.

Importing it registers its solver workflow, its scripted roles and its cold-start demonstrations.
"""

from score_lightning.methods.mams import demos, scalars, scripted, workflow  # noqa: F401  (they register)
