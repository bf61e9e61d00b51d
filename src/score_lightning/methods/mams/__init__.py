"""MaMs (``solver.agent=mams``): one policy as search / state / report roles with bounded prompts.

Importing its ``plugin`` module registers its solver workflow, its scripted roles and its cold-start demonstrations.
"""
