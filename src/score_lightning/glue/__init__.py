"""``ScoreModule``'s Lightning hooks other than the step: building its models, engines and optimisers
(:mod:`.building`), the run state a checkpoint carries (:mod:`.run_state`), and what leaves the
process (:mod:`.outputs`: logged scalars, a halt, the export). ``module.py`` keeps the step itself."""
