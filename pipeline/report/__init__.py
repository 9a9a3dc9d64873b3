"""What a finished run did, from its output files: `summary` (the command, `python -m
pipeline.report`), `stats` (the numbers) and `html` (the page with plots)."""
