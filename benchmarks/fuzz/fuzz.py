"""One-off: random exactness trials of both engines against `generate()` (docs/batching.md, "Exact per row").
Usage: python benchmarks/fuzz/fuzz.py START DEADLINE_EPOCH [2|3]  (2: the trials biased to the batch engine; 3: 2 with
half its adaptive trials timing their own costs);
python benchmarks/fuzz/fuzz.py --trial N (--trial2 N, --trial3 N) reruns one trial.
Results: fuzz-results{PHASE}.jsonl."""
import faulthandler
import json
import signal
import sys
import time
from pathlib import Path  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
import fuzzlib  # noqa: E402

faulthandler.enable()


class Hang(Exception):
    pass


def alarm(*_):
    raise Hang("trial exceeded 240 s")


signal.signal(signal.SIGALRM, alarm)

if sys.argv[1] in ("--trial", "--trial2", "--trial3"):
    cfg = {"--trial": fuzzlib.random_config, "--trial2": fuzzlib.random_config2,
           "--trial3": fuzzlib.random_config3}[sys.argv[1]](int(sys.argv[2]))
    print(json.dumps(cfg))
    print(json.dumps(fuzzlib.run_config(cfg)))
    sys.exit()

start, deadline = int(sys.argv[1]), float(sys.argv[2])
PHASE = sys.argv[3] if len(sys.argv) > 3 else "1"
t = start
with open(f"fuzz-results{PHASE}.jsonl", "a") as f:
    while time.time() < deadline:
        cfg = {"1": fuzzlib.random_config, "2": fuzzlib.random_config2, "3": fuzzlib.random_config3}[PHASE](t)
        signal.alarm(240)
        try:
            res = fuzzlib.run_config(cfg)
        except Hang as exc:
            res = {"status": "error", "where": "hang", "tb": str(exc)}
        except Exception:
            import traceback
            res = {"status": "error", "where": "harness", "tb": traceback.format_exc()[-3000:]}
        signal.alarm(0)
        summary = {k: cfg[k] for k in ("trial", "kind", "engine", "drafter", "graphs", "draft_graphs", "B", "gamma",
                                        "max_new", "prefill_tokens", "admit_together", "split")}
        summary.update(policy=cfg["policy"].get("costs", cfg["policy"]["type"]), n_prompts=len(cfg["prompts"]),
                       draft=cfg["draft"]["type"], eos=bool(cfg["eos"]))
        f.write(json.dumps({**summary, **res}) + "\n")
        f.flush()
        print(t, res["status"], round(res.get("s", 0), 1), flush=True)
        t += 1
