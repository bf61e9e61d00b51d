"""Clients of the services a run talks to outside its own process: OpenAI-compatible chat endpoints
(``chat``), the process-wide limiter every such call goes through (``limiter``), the LLM judge that scores
reports (``judge``) and MCP tool servers (``mcp``).

The layer sits below ``step/``, ``harness/``, ``rubrics/``, ``retrieval/`` and ``evaluation/``: it imports
nothing from the package but the root modules (``errors``), so every caller reaches an external service
through one set of timeouts, retries, error kinds and limits (``tests/test_import_graph.py`` keeps it so).
"""
