"""The launch layer: composing a run from its config (``training``, the composition root), run folders
and resume, strategies, config checks by group, token budgets and threads. The top floor: no module
below it imports it (``tests/test_import_graph.py``)."""
