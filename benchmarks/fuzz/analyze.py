"""One-off: a failed fuzz trial's differing rows, float32 against float64 at the first differing token.
Usage: python benchmarks/fuzz/analyze.py PHASE TRIAL (reads fuzz-results{PHASE}.jsonl in the working directory)."""
import copy
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
import fuzzlib  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
phase, trial = sys.argv[1], int(sys.argv[2])
cfg = {"1": fuzzlib.random_config, "2": fuzzlib.random_config2, "3": fuzzlib.random_config3}[phase](trial)
rec = next(r for r in map(json.loads, open(f"fuzz-results{phase}.jsonl")) if r["trial"] == trial)
target, draft = fuzzlib.build(cfg)
if cfg["eos"]:  # as run_config sets it
    e = cfg["eos"]
    ref0 = fuzzlib.hf_greedy(target, cfg["prompts"][e["prompt"]], 30)
    target.generation_config.eos_token_id = ref0[min(e["pos"], len(ref0) - 1)]
t64 = copy.deepcopy(target).double()
for b in rec["bad"]:
    p, j, ref, got = cfg["prompts"][b["prompt"]], b["first_diff"], b["ref"], b["got"]
    ids32, v32 = fuzzlib.top2(target, p, ref[:j])
    ids64, v64 = fuzzlib.top2(t64, p, ref[:j])  # (top2 reads back in float32)
    print(json.dumps({"trial": trial, "kind": cfg["kind"], "B": cfg["B"], "engine": cfg["engine"], "pos": j,
                      "generate": ref[j], "ours": got[j], "fp32_top2": [ids32, v32], "fp64_top2": [ids64, v64]}))
