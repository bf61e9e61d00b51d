"""What a run tells its user beyond return values: loggers built from config and the text, histograms and
custom-scalar page a step logs (``loggers``), a CSV logger that a resume appends to (``csv_logger``), one clean
console (``console``) and the progress bar with an ETA that a SCORE run and the cold start both show
(``progress``). Below ``step/``: the step, the callbacks, the run state, the cold start, the rollout worker and
the launch layer all log through it."""
