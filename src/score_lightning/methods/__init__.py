"""The relatives of SCORE as plug-ins, one folder each.

The core (the step, rollouts, roles, rewards, policy, harness) never imports this package: it looks a method
up by the name a config key gives (:mod:`score_lightning.registry`), and the first lookup of an unknown name
imports :mod:`score_lightning.methods.plugins` once, which imports each method's ``plugin`` module. Importing a
method's package itself (or its ``config`` module, the schema of its settings) registers nothing and loads no
torch, so the config can be checked in a second. Add a method by adding its folder (with ``plugin.py``) and one
import line in ``plugins.py`` (docs/EXTENDING.md).
"""
