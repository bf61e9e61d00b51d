"""What a run tells its user beyond return values: loggers built from config and the text, histograms and
custom-scalar page a step logs (``loggers``), and one clean console (``console``). Below ``step/``: the
step, the callbacks, the run state, the cold start, the rollout worker and the launch layer all log
through it."""
