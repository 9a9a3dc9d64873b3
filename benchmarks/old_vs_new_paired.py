"""Old engine against new in ONE process, call by call, for a CPU whose speed moves between runs.

Run in separate processes minutes apart (`benchmarks/old_vs_new.sh`, in git history at 4947031), the
two sides could not show a 3% effect on a shared 2-core machine: its unchanged HF control moved by up
to 13% between them. Here the old commit's `specdec_core` is imported beside the new one (extracted with
`git archive` as the package `specdec_core_old`, its imports renamed), both sides decode the same
prompts with the same weights (each side's own `prepare_for_cpu` on its own copy), and every
measurement alternates old, new / new, old within seconds, REPS times. A ratio is new / old
tokens per second (> 1: new is faster); the table gives each measurement's median ratio and a 90%
interval from the spread of the per-round ratios (a t interval of their logs). Greedy outputs of
the two sides are checked equal on every call.

    python benchmarks/old_vs_new_paired.py                    # ac737fe against this tree, 6 rounds
    python benchmarks/old_vs_new_paired.py --reps 1 --tiny    # the script's smoke test
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import math
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.bench.throughput import engine_modules, ours_batched  # noqa: E402 (this tree's, by the path above)


def old_package(commit: str, dest: Path) -> str:
    """`specdec_core` at `commit`, importable as `specdec_core_old`."""
    done = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "specdec_core"], capture_output=True)
    if done.returncode:  # (a copy without git history, or a commit it does not hold)
        sys.exit(f"error: --old {commit}: git archive found no such commit in {ROOT} ({done.stderr.decode().strip()}); "
                 "run this from a git clone")
    archive = done.stdout
    tmp = dest / "x"
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
    pkg = dest / "specdec_core_old"
    shutil.move(tmp / "specdec_core", pkg)
    for f in pkg.glob("*.py"):
        f.write_text(f.read_text().replace("specdec_core", "specdec_core_old"))
    sys.path.insert(0, str(dest))
    return "specdec_core_old"


def decode(core, target, draft, prompts: list[list[int]], batch: int, gamma: int | str, max_new: int):
    """(outputs, seconds) of one side's engine, run as the throughput bench runs ours (`ours_batched`)."""
    drafter = core.drafters.NoDrafter() if draft is None else core.drafters.ModelDrafter(draft)
    outs, secs, _ = ours_batched(target, drafter, prompts, batch, gamma, max_new, core=core)
    return outs, secs


def pairs(tiny: bool, cache: Path, names: set[str]) -> dict[str, tuple]:
    """name -> (target, draft, prompts' ids, share_encoder) for the named of: the quick Llama pair at batch 1
    ("bench") and batched ("llama", the same models), the T5 pair, the demo's pair."""
    from transformers import AutoTokenizer

    from pipeline.bench.family_pairs import FAMILY_PAIRS, TINY_FAMILY_PAIRS, build_family_pair
    from pipeline.bench.pairs import QUICK_SYNTH, TINY_SYNTH, build_synthetic_pair, synthetic_prompts
    from pipeline.demo.assets import ASSETS, demo_prompt_rows
    from specdec_core.loading import load_model

    loaded: dict[str, tuple] = {}

    def models(dirs) -> tuple:
        """The pair in `dirs`, loaded once however many prompt sets use it."""
        if str(dirs["target"]) not in loaded:
            loaded[str(dirs["target"])] = tuple(load_model(str(dirs[k]), torch.device("cpu"), torch.float32)
                                                for k in ("target", "draft"))
        return loaded[str(dirs["target"])]

    def synthetic(build, spec, n, length, share=False):
        dirs = build(spec, cache)
        tok = AutoTokenizer.from_pretrained(dirs["target"])
        return *models(dirs), [tok(text)["input_ids"] for _, text in synthetic_prompts(spec, n, length)], share

    def demo():
        tok = AutoTokenizer.from_pretrained(ASSETS / "target")
        rows = demo_prompt_rows()[: 4 if tiny else 40]
        return *models({"target": ASSETS / "target", "draft": ASSETS / "draft"}), [
            tok(r["prompt"])["input_ids"] for r in rows], False

    llama = QUICK_SYNTH if not tiny else TINY_SYNTH
    t5 = (TINY_FAMILY_PAIRS if tiny else FAMILY_PAIRS)["t5"]
    makers = {"bench": lambda: synthetic(build_synthetic_pair, llama, 2 if tiny else 6, 16 if tiny else 64),
              "llama": lambda: synthetic(build_synthetic_pair, llama, 8 if tiny else 64, 16 if tiny else 48),
              "t5": lambda: synthetic(build_family_pair, t5, 8 if tiny else 32, 16 if tiny else 32, share=True),
              "demo": demo}
    return {name: make() for name, make in makers.items() if name in names}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", default="ac737fe", help="the old commit")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--tiny", action="store_true", help="tiny pairs, short runs: checks the script, not the code")
    p.add_argument("--only", default="", help="comma-separated measurement names (prefixes) to run")
    p.add_argument("--out", default="/tmp/old_vs_new_paired.json")
    p.add_argument("--cache_dir", default=str(ROOT / "benchmarks/.cache"))
    a = p.parse_args(argv)
    from scipy.stats import t as t_dist
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="ovn-"))
    sides = {"old": engine_modules(old_package(a.old, work)), "new": engine_modules()}
    demo_gamma = json.loads((ROOT / "pipeline/demo/pair/MANIFEST.json").read_text())["quality"].get(
        "num_speculative_tokens", 4)
    new = 24 if a.tiny else None
    plan = [("batch 1, quick pair, draft, gamma 4", "bench", True, 1, 4, new or 48),
            ("batch 1, quick pair, alone", "bench", False, 1, 4, new or 48)]
    for b in (8, 16, 32):
        # Fixed gamma: adaptive gamma learns its costs from timings each call, and on this machine the gamma it chose
        # (and the verify passes: 538-818 at B = 16) moved between calls of the same side, which swamps the code.
        plan += [(f"Llama quick pair B = {b}, draft, gamma 2", "llama", True, b, 2, new or 24),
                 (f"Llama quick pair B = {b}, alone", "llama", False, b, 4, new or 24)]
    for b in (8, 16, 32):
        plan += [(f"T5 pair B = {b}, draft, gamma 3", "t5", True, b, 3, new or 16),
                 (f"T5 pair B = {b}, alone", "t5", False, b, 3, new or 16)]
    plan += [(f"the demo, draft, gamma {demo_gamma}", "demo", True, 1, demo_gamma, new or 160),
             ("the demo, alone", "demo", False, 1, demo_gamma, new or 160)]
    if a.only:
        plan = [x for x in plan if any(x[0].startswith(o) for o in a.only.split(","))]
    models = pairs(a.tiny, Path(a.cache_dir), {x[1] for x in plan})
    # (side, pair, copy) -> (target, draft): each side's own CPU preparation of its own copy of the weights, two
    # copies a side made in the order old, new, new, old. The order of the copies may move a side's speed (batch 1
    # read 0.97 with old's copy made first, 1.00 with new's, 10 rounds each); rounds use copy 0 and copy 1 in turn.
    prepared = {}
    for name, (target, draft, _, share) in models.items():
        for k, s in ((0, "old"), (0, "new"), (1, "new"), (1, "old")):
            t, d = (sides[s].cpu_speed.prepare_for_cpu(copy.deepcopy(m)) for m in (target, draft))
            if share:
                d.encoder = t.get_encoder()
            prepared[s, name, k] = t, d
    warm = {x[1]: x for x in reversed(plan)}  # each pair's first measurement
    for _label, pair, with_draft, b, g, _n in warm.values():  # warm-up: first-call allocations, kernel choices
        for s, k in ((s, k) for s in sides for k in (0, 1)):
            t, d = prepared[s, pair, k]
            decode(sides[s], t, d if with_draft else None, models[pair][2][:2], min(b, 2), g, 4)
    results: dict[str, dict[str, list[float]]] = {x[0]: {"old": [], "new": []} for x in plan}
    t_start = time.perf_counter()
    for rep in range(a.reps):
        order = ("old", "new") if rep % 2 == 0 else ("new", "old")
        for label, pair, with_draft, b, g, n in plan:
            outs = {}
            for s in order:
                t, d = prepared[s, pair, rep // 2 % 2]  # each order of the sides with each copy
                outs[s], secs = decode(sides[s], t, d if with_draft else None, models[pair][2], b, g, n)
                results[label][s].append(sum(len(o) for o in outs[s]) / secs)
            if outs["old"] != outs["new"]:
                raise SystemExit(f"{label}: old and new decode different tokens")
            print(f"round {rep + 1} {label}: old {results[label]['old'][-1]:.1f} new {results[label]['new'][-1]:.1f} "
                  f"tokens/s", flush=True)
        Path(a.out).write_text(json.dumps({"old": a.old, "reps_done": rep + 1, "results": results}, indent=1))
    print(f"\n{a.reps} rounds in {time.perf_counter() - t_start:.0f} s; old {a.old}, new: this tree. "
          "Ratios new / old of tokens/s, per round; greedy outputs equal on every call.\n")
    print("| measurement | old tokens/s (median) | new tokens/s (median) | new / old: median | 90% interval |")
    print("|---|---|---|---|---|")
    for label, r in results.items():
        logs = [math.log(n / o) for o, n in zip(r["old"], r["new"], strict=True)]
        n = len(logs)
        half = t_dist.ppf(0.95, n - 1) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else float("nan")
        mean = statistics.mean(logs)
        print(f"| {label} | {statistics.median(r['old']):.1f} | {statistics.median(r['new']):.1f} | "
              f"{statistics.median(math.exp(x) for x in logs):.3f} | {math.exp(mean - half):.3f}-"
              f"{math.exp(mean + half):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
