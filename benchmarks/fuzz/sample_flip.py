# ruff: noqa: E402
"""One-off: where a sampled fuzz trial's batched row parts from its batch-1 sample (`sample_fuzz.py`), and why.
Usage: python benchmarks/fuzz/sample_flip.py TRIAL ROW. Logs the row's accept/reject calls in both engines (by its
generator's seed), prints the first that differs, the generator state before it, how far the target's probabilities
moved, and the sampler's race (torch.multinomial: argmax of p / Exp(1)) between its two leaders."""
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
import fuzzlib
import sample_fuzz
import torch

from specdec_core import acceptance, rounds
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.engine import SpeculativeGenerator
from specdec_core.pass_settings import PassSettings
from specdec_core.processing import SamplingSettings

cfg, row = sample_fuzz.config(int(sys.argv[1])), int(sys.argv[2])
target, draft = fuzzlib.build(cfg)
if cfg["eos"]:
    target.generation_config.eos_token_id = cfg["eos"]["token"]
if cfg["repetition_penalty"]:
    target.generation_config.repetition_penalty = cfg["repetition_penalty"]
seed, log = cfg["seeds"][row], []


def logged(drafts, p, q, generator):
    if generator.initial_seed() != seed:
        return acceptance.verify_sampled(drafts, p, q, generator)
    state = generator.get_state()
    n, token = acceptance.verify_sampled(drafts, p, q, generator)
    log.append({"drafts": drafts, "n": n, "token": token, "p": p[n].clone(), "state": state})
    return n, token


rounds.verify_sampled = logged
sampling = SamplingSettings(**cfg["sampling"])
alone = SpeculativeGenerator(target, fuzzlib.make_drafter(cfg, draft), num_speculative_tokens=cfg["gamma"],
                             max_new_tokens=cfg["max_new"], sampling=sampling, cuda_graphs=cfg["graphs"])
alone.generate(cfg["prompts"][row], seed)
first, log[:] = log[:], []
batch = BatchSpeculativeGenerator(target, fuzzlib.make_drafter(cfg, draft), batch_size=cfg["B"],
                                  num_speculative_tokens=cfg["gamma"], max_new_tokens=cfg["max_new"],
                                  sampling=sampling, prefill_tokens=cfg["prefill_tokens"], cuda_graphs=cfg["graphs"],
                                  settings=PassSettings(admit_together=cfg["admit_together"]))
batch.generate_many(list(zip(cfg["prompts"], cfg["seeds"], strict=True)))
for i, (a, b) in enumerate(zip(first, log, strict=False)):
    if (a["drafts"], a["n"], a["token"]) != (b["drafts"], b["n"], b["token"]):
        race = [(p / torch.empty_like(p).exponential_(generator=torch.Generator().set_state(a["state"]))).topk(2)
                for p in (a["p"], b["p"])]
        print(json.dumps({"call": i, "drafts": a["drafts"], "kept": [a["n"], b["n"]], "token": [a["token"], b["token"]],
                          "same_generator_state": torch.equal(a["state"], b["state"]),
                          "largest_p_change": float((a["p"] - b["p"]).abs().max()),
                          "race_alone": [r.tolist() for r in race[0]], "race_batched": [r.tolist() for r in race[1]]}))
        break
else:
    print("no call differs")
