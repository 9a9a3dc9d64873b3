"""Benchmarks, side by side in one run: `speed` (latency against the target alone and Hugging Face
assisted generation, `python -m pipeline.bench`), `throughput` (batched tokens/s per worker) and
`cross` (a draft with another tokenizer); `pairs`, `configs`, `measure` and `report` serve them."""
