"""What this method registers with the core's extension points: importing this module registers them
(``score_lightning.methods.plugins`` imports it on the first lookup of a name nobody registered)."""

from score_lightning.methods.judge import citation, scoring  # noqa: F401  (they register)
