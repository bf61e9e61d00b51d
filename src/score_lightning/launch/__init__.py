"""The launch layer: composing a run from its config (``training``, the composition root), run folders
and resume, strategies, loggers, config checks by group, token budgets, preflight, threads and the console."""
