"""Moved to :mod:`score_lightning.clients.chat` (the clients layer); this name stays for the modules and
scripts that import it from here (``items/reword.py``, ``scripts/build_rubrics.py``)."""

from score_lightning.clients.chat import (  # noqa: F401
    PLACEHOLDER_API_KEY, ChatClient, ChatOutcome, ReplyError, _corrected, _Failure, extract_json_object,
)
