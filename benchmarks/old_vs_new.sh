#!/usr/bin/env bash
# Old code (a git worktree of OLD_COMMIT, default ac737fe: the engine before its redesign into one
# cache, loop and plan) against new code (the working tree of this checkout), on this machine, in one
# invocation: every measurement runs old, new, then new, old, ... (REPS rounds, the order alternating
# so that load drifting over a round favours neither), each side's code run by cd-ing into its tree (the cwd comes
# first on sys.path, before the editable install; checked below). Both sides read the same models
# from one cache. Writes $OUT/old_vs_new.md (old values, new values, median of the per-round ratios
# new/old; > 1 means new is faster) and every raw log and report under $OUT/raw. Touches no tracked
# file; nothing goes into the repository but the git-ignored model cache (benchmarks/.cache).
#
#   bash benchmarks/old_vs_new.sh                       # full size: about 25 min on 2 cores (DEMO=0: 12)
#   REPS=1 DEMO=0 TINY=1 bash benchmarks/old_vs_new.sh  # smoke test of the script (ratios meaningless)
#   STEPS=bench,demo bash benchmarks/old_vs_new.sh      # only the batch-1 measurements
#
# Measurements: (a) the batch-1 bench on the quick pair (`pipeline.bench --quick`: ours with the draft,
# gamma 4, and ours alone, tokens/s and the bench's decode speed-up); (b) `pipeline.bench.throughput`
# of the quick Llama pair at B = 8, 16, 32 (drafters model and none, adaptive gamma as in
# BENCHMARKS.md) and of the T5 pair (gamma 3); HF's plain generate runs in each as a control (same
# HF code on both sides); (c) with DEMO=1, `pipeline.demo` (its draft's speed-up over the target alone).
# Threads: THREADS (default 1) for (a) and (b) on both sides: on a 2-core machine shared with other
# work two spinning OpenMP threads swing 10x (docs/performance.md); the demo runs on its default 1.
set -euo pipefail

NEW=$(cd "$(dirname "$0")/.." && pwd)
OLD_COMMIT=${OLD_COMMIT:-ac737fe}
OLD=${OLD:-/tmp/specdec-old}
PY=${PY:-$NEW/.venv/bin/python}
OUT=${OUT:-/tmp/old_vs_new}
CACHE=${CACHE:-$NEW/benchmarks/.cache}
REPS=${REPS:-2} THREADS=${THREADS:-1} DEMO=${DEMO:-1} TINY=${TINY:-0}
STEPS=${STEPS:-bench,tp,demo}  # which measurements: (a) bench, (b) tp, (c) demo (with DEMO=1)
step() { [[ ,$STEPS, == *,$1,* ]]; }
if [[ $TINY == 1 ]]; then  # every run a few seconds: checks the script, not the code
  BENCH_SIZE=${BENCH_SIZE:-tiny} TP_SIZE=${TP_SIZE:-tiny} T5_SIZE=${T5_SIZE:-tiny} DEMO_ARGS=${DEMO_ARGS:---tiny}
  : "${BENCH_PROMPTS:=2}" "${BENCH_PROMPT_TOKENS:=16}" "${BENCH_NEW:=8}"
  : "${TP_PROMPTS:=8}" "${TP_PROMPT_TOKENS:=16}" "${TP_NEW:=8}" "${T5_PROMPTS:=8}" "${T5_PROMPT_TOKENS:=16}" "${T5_NEW:=8}"
fi
BENCH_SIZE=${BENCH_SIZE:-quick} BENCH_PROMPTS=${BENCH_PROMPTS:-6} BENCH_PROMPT_TOKENS=${BENCH_PROMPT_TOKENS:-64}
BENCH_NEW=${BENCH_NEW:-48} BENCH_GAMMA=${BENCH_GAMMA:-4}
TP_SIZE=${TP_SIZE:-quick} TP_PROMPTS=${TP_PROMPTS:-64} TP_PROMPT_TOKENS=${TP_PROMPT_TOKENS:-48} TP_NEW=${TP_NEW:-24}
TP_BATCHES=${TP_BATCHES:-8,16,32} TP_GAMMAS=${TP_GAMMAS:-adaptive}
T5_SIZE=${T5_SIZE:-full} T5_PROMPTS=${T5_PROMPTS:-32} T5_PROMPT_TOKENS=${T5_PROMPT_TOKENS:-32} T5_NEW=${T5_NEW:-16}
T5_BATCHES=${T5_BATCHES:-8,16,32} T5_GAMMAS=${T5_GAMMAS:-3} DEMO_ARGS=${DEMO_ARGS:-}

rm -rf "$OUT/raw" && mkdir -p "$OUT/raw"  # (no stale logs from an earlier run in the table)
[[ -d $OLD ]] || { git -C "$NEW" worktree prune; git -C "$NEW" worktree add --detach "$OLD" "$OLD_COMMIT"; }
OLD=$(cd "$OLD" && pwd)
[[ $(git -C "$OLD" rev-parse HEAD) == $(git -C "$NEW" rev-parse "$OLD_COMMIT") ]] || { echo "$OLD is not at $OLD_COMMIT" >&2; exit 1; }
for side in old new; do  # each side must import its own tree's code, not the editable install's
  dir=$([[ $side == old ]] && echo "$OLD" || echo "$NEW")
  got=$(cd "$dir" && "$PY" -c 'import specdec_core, pipeline; print(specdec_core.__file__, pipeline.__file__)')
  [[ $got == "$dir/specdec_core/"*" $dir/pipeline/"* ]] || { echo "$side imports $got, not $dir" >&2; exit 1; }
  echo "$side: $dir at $(git -C "$dir" rev-parse --short HEAD), $(git -C "$dir" status --short | wc -l) files changed or untracked"
done | tee "$OUT/raw/sides.txt"

run() {  # run SIDE NAME REP MODULE ARGS...: one run in SIDE's tree, its log and wall time in $OUT/raw
  local side=$1 name=$2 rep=$3; shift 3
  local dir=$NEW log="$OUT/raw/$name-$side-$rep.log" t0=$SECONDS rc=0
  [[ $side == old ]] && dir=$OLD
  (cd "$dir" && "$PY" -m "$@") >"$log" 2>&1 || rc=$?
  echo "$name $side $rep $((SECONDS - t0)) $rc" | tee -a "$OUT/raw/timings.txt"
}

for rep in $(seq 1 "$REPS"); do
  sides="old new"; (( rep % 2 )) || sides="new old"
  for side in $sides; do
    step bench || continue
    run $side bench "$rep" pipeline.bench "--$BENCH_SIZE" --pairs synthetic --skip_beam --skip_kernels \
      --skip_bad_draft --skip_sampling --draft_dtypes float32 --gamma "$BENCH_GAMMA" --prompts "$BENCH_PROMPTS" \
      --prompt_tokens "$BENCH_PROMPT_TOKENS" --max_new_tokens "$BENCH_NEW" --threads "$THREADS" \
      --cache_dir "$CACHE" --out "$OUT/raw/bench-$side-$rep.md" --csv "$OUT/raw/bench-$side-$rep.csv"
  done
  for pair in llama t5; do
    for side in $sides; do
      step tp || continue
      if [[ $pair == llama ]]; then
        set -- --size "$TP_SIZE" --prompts "$TP_PROMPTS" --prompt_tokens "$TP_PROMPT_TOKENS" \
          --max_new_tokens "$TP_NEW" --batches "$TP_BATCHES" --gammas "$TP_GAMMAS" --hf_cache static
      else
        set -- --size "$T5_SIZE" --prompts "$T5_PROMPTS" --prompt_tokens "$T5_PROMPT_TOKENS" \
          --max_new_tokens "$T5_NEW" --batches "$T5_BATCHES" --gammas "$T5_GAMMAS" --hf_cache dynamic
      fi
      run $side "tp-$pair" "$rep" pipeline.bench.throughput --pair $pair "$@" --drafters model,none \
        --hf_kernels prepacked --reps 1 --threads "$THREADS" --cache_dir "$CACHE" --out "$OUT/raw/tp-$pair-$side-$rep.md"
    done
  done
  if [[ $DEMO == 1 ]] && step demo; then
    for side in $sides; do
      rm -rf "$OUT/raw/demo-$side-$rep"
      # shellcheck disable=SC2086  # DEMO_ARGS: words
      run $side demo "$rep" pipeline.demo --workdir "$OUT/raw/demo-$side-$rep" $DEMO_ARGS
    done
  fi
done

"$PY" - "$OUT" "$REPS" "$BENCH_GAMMA" <<'EOF' | tee "$OUT/old_vs_new.md"
import json, re, statistics as st, sys
from pathlib import Path

out, reps, gamma = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
raw, vals = out / "raw", {}  # measurement -> {side: {rep: value}}

def put(key, side, rep, v):
    vals.setdefault(key, {"old": {}, "new": {}})[side][rep] = v

for side in ("old", "new"):
    for rep in range(1, reps + 1):
        f = raw / f"bench-{side}-{rep}-summary.json"
        if f.exists():
            s = {r["config"]: r for r in json.loads(f.read_text())["results"][0]["summary"]}
            d, alone = s[f"ours: model g={gamma}"], s["ours: target alone"]
            put(f"batch 1 (bench): ours, draft g={gamma}, tokens/s", side, rep, d["tok_s"])
            put("batch 1 (bench): ours, target alone, tokens/s", side, rep, alone["tok_s"])
            put("batch 1 (bench): draft's speed-up (decode)", side, rep, d["speedup"])
        for pair in ("llama", "t5"):
            f = raw / f"tp-{pair}-{side}-{rep}.md"
            for line in f.read_text().splitlines() if f.exists() else []:
                c = [x.strip() for x in line.strip().strip("|").split("|")]
                if len(c) >= 8 and c[1].isdigit():
                    put(f"{pair} B={c[1]}: {c[0]}, tokens/s", side, rep, float(c[2]))
        f = raw / f"demo-{side}-{rep}.log"
        for line in f.read_text().splitlines() if f.exists() else []:  # its table: model draft, lookup, alone
            nums = [float(x) for x in re.findall(r"\d+\.\d+", line)]
            if line.startswith("speed-up vs target alone "):
                put("demo: model draft's speed-up over the target alone", side, rep, nums[0])
            elif line.startswith("tokens/s "):
                put("demo: model draft, tokens/s", side, rep, nums[0])
                put("demo: target alone, tokens/s", side, rep, nums[2])

fails = [l for l in (raw / "timings.txt").read_text().splitlines() if not l.endswith(" 0")]
print("# Old code against new\n\n" + "".join(f"- {l}\n" for l in (raw / "sides.txt").read_text().splitlines()))
print(f"{reps} round(s), old then new in odd rounds, new then old in even ones; ratio: median over rounds of new/old (> 1: new faster). "
      "Raw logs and reports: " + str(raw) + (f". FAILED runs (name side round seconds rc): {fails}" if fails else "") + "\n")
print("| measurement | old | new | new/old |\n|---|---|---|---|")
for key, v in vals.items():
    both = sorted(set(v["old"]) & set(v["new"]))
    ratio = st.median(v["new"][r] / v["old"][r] for r in both) if both else None
    f = lambda side: " / ".join(f"{v[side][r]:.2f}" for r in sorted(v[side])) or "–"
    print(f"| {key} | {f('old')} | {f('new')} | {'–' if ratio is None else f'{ratio:.3f}'} |")
EOF
echo "wall time per run (name side round seconds rc): $OUT/raw/timings.txt; total $SECONDS s"
