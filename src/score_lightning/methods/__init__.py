"""Methods beside SCORE, one folder each: a plug-in the step reaches through its registries, never edits."""
