"""Choose the drafter, gamma and batch size before a large job: `tuner` (the command, `python -m
pipeline.tune`), `command` (its flags and checks), `model` (the speed-up model fitted to measured costs) and
`report` (its table)."""
