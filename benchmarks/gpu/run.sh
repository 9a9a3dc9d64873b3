#!/usr/bin/env bash
# The whole GPU check in one call of the GPU machine (see README.md beside this file): wheels it
# lacks, the CUDA tests, the GPU benchmark in bf16 and fp32, and a whole job on the GPU. Each step
# has its own time limit and appends to $OUT/log.txt; figures land in $OUT/bench/ as they are made.
# STEPS picks steps, run one after the other (default: tests-compiled job), PARALLEL steps run side
# by side after them;
# "tests" runs the CUDA tests but the compiled ones, "tests-compiled" those (each failure's report
# lands in $OUT/failures.txt as it happens); BATCHED_SIZES: the batched step's B (default 8,32),
# BATCHED_NEW_TOKENS its new tokens per row (default 32), BATCHED_LIMIT its time limit in seconds
# (default 300); TESTS_K the tests step's pytest -k (default "not compiled");
# "workspace" checks that the engine's graphs survive cuBLAS workspaces cleared elsewhere,
# "workspace-control" the same without the engine's own clearing; SINGLE_ARGS, SINGLE_INCLUDE:
# the single step's sizes and configurations; BATCHED_INCLUDE: the batched step's configurations
# (a regex; HF generate and ours alone always run); BEFORE=1 adds ours eager with PyTorch's own attention
# choice (cuDNN allowed); SIZE=small runs each step at a size for a first try;
# DEVICE=cpu SHAPE=tiny PYTHON=.venv/bin/python try the script on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
STEPS=${STEPS:-tests-compiled job}
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-tinyllama-1.1b}
PY=${PYTHON:-python3}
mkdir -p "$OUT/bench"
LOG="$OUT/log.txt"
SCRATCH=$(mktemp -d)  # each step's whole output and the job's files (only $OUT comes back)
# The GPU machine's Python is 3.12 and lacks Beam and a recent transformers: the carried wheels.
# Installed once per machine, so that later invocations can run side by side (see PARALLEL below).
if compgen -G ".whl/*cp312*.whl" >/dev/null && python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  if [ ! -e /tmp/site/.installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
    touch /tmp/site/.installed
  fi
  export PYTHONPATH=/tmp/site:$PWD
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  cc --version 2>/dev/null | head -n 1 || echo "no C compiler: Triton cannot build torch.compile's kernels here"
} >>"$LOG" 2>&1

step() {  # step NAME SECONDS command...: run it under a limit, its output's tail into the log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name" >>"$LOG"
  timeout "$limit" "$@" >"$SCRATCH/$name.txt" 2>&1
  local rc=$?
  tail -n 60 "$SCRATCH/$name.txt" >>"$LOG"
  echo "== $name: exit $rc in $((SECONDS - t0)) s" >>"$LOG"
}

if [ "${SIZE:-full}" = small ]; then
  BF16="--prompts 2 --warmup 1 --batch_prompts 16 --batch_sizes 8 --max_new_tokens 32"
  ONE="--prompts 2 --warmup 1 --max_new_tokens 32"
  MANY="--batch_prompts 16 --batch_sizes 8 --batch_max_new_tokens 16"
  FP32="--prompts 2 --warmup 1 --max_new_tokens 32"
  BIG="--prompts 1 --warmup 1 --max_new_tokens 16"
else
  BF16="--prompts 6 --warmup 1 --batch_prompts 128 --batch_sizes 8,32,128 --max_new_tokens 128 --batch_max_new_tokens 32"
  ONE="--prompts 4 --warmup 1 --max_new_tokens 128"
  SIZES=${BATCHED_SIZES:-8,32}  # (as many prompts as the largest B, 64 at least)
  MANY="--batch_prompts $(tr , '\n' <<<"64,$SIZES" | sort -n | tail -n 1) --batch_sizes $SIZES"
  MANY="$MANY --batch_max_new_tokens ${BATCHED_NEW_TOKENS:-32}"
  FP32="--prompts 4 --warmup 1 --max_new_tokens 128"
  BIG="--prompts 3 --warmup 1 --max_new_tokens 64"
fi
ONE=${SINGLE_ARGS:-$ONE}  # e.g. fewer prompts where device time is short
BATCHED_INCLUDE=${BATCHED_INCLUDE:-'chained|compile|prefills'}
SINGLE_INCLUDE=${SINGLE_INCLUDE:-'^(HF generate, static cache \+ compile|ours, draft(, chained)?(, compiled(, compiled prefills)?)?|ours, target alone, compiled)$'}
# The targets' comparison: HF generate with a static cache and torch.compile against ours with graphs,
# chained drafts, and passes compiled before capture (both compile in the warm-up).
COMPILED="--dtype bfloat16 --hf_compile --torch_compile"
if [ "${BEFORE:-0}" = 1 ]; then BF16="$BF16 --batched_before"; else BF16="$BF16 --include ^(?!.*cuDNN)"; fi
run_step() {
  local s=$1
  case $s in
    # -v: a run cut short still shows each test it ended; failures.txt: why each failed, as it fails.
    tests) FAILURES_FILE="$OUT/failures.txt" step tests 390 $PY -m pytest -v -p no:cacheprovider -p tests.failures_now \
      tests/test_gpu_placement.py tests/test_cuda.py -k "${TESTS_K:-not compiled}" ;;
    tests-compiled) FAILURES_FILE="$OUT/failures.txt" step tests-compiled 240 $PY -m pytest -v -p no:cacheprovider \
      -p tests.failures_now tests/test_cuda.py -k compiled ;;
    single) step single 230 $PY -m pipeline.bench.gpu --device $DEVICE --shape $SHAPE $COMPILED \
      --sections single,profile $ONE --out "$OUT/bench" --include "$SINGLE_INCLUDE" ;;
    # The engine's graphs after cuBLAS's workspaces were cleared elsewhere; control: without the
    # engine's own clearing around its captures (shows whether this GPU's matmuls use a workspace).
    workspace) step workspace 60 $PY -m tests.cuda_workspace_child ;;
    workspace-control) step workspace-control 60 $PY -m tests.cuda_workspace_child control ;;
    batched) step batched "${BATCHED_LIMIT:-300}" $PY -m pipeline.bench.gpu --device $DEVICE --shape $SHAPE $COMPILED \
      --sections batched,profile_batched $MANY --include "$BATCHED_INCLUDE" \
      --out "$OUT/bench/batched${BATCHED_NEW_TOKENS:+-${BATCHED_NEW_TOKENS}t}" ;;
    bf16) step bf16 320 $PY -m pipeline.bench.gpu --device $DEVICE --shape $SHAPE --dtype bfloat16 $BF16 --out "$OUT/bench" ;;
    fp32) step fp32 150 $PY -m pipeline.bench.gpu --device $DEVICE --shape $SHAPE --dtype float32 --sections single \
      $FP32 --include '^ours, (draft|target alone)(, eager)?$' --out "$OUT/bench" ;;
    job)
      step job-inputs 60 $PY -m pipeline.bench.gpu --device $DEVICE --shape $SHAPE --dtype bfloat16 --batch_prompts 64 --save $SCRATCH/job
      step job 240 $PY -m pipeline.run --input $SCRATCH/job/prompts.parquet --output $SCRATCH/job/out/gens \
        --target_model $SCRATCH/job/target --draft_model $SCRATCH/job/draft --device $DEVICE --dtype bfloat16 \
        --batch_size 16 --max_new_tokens 64
      step job-rows 30 $PY -c "import glob, pyarrow.parquet as pq
ok = sum(pq.read_table(f).num_rows for f in glob.glob('$SCRATCH/job/out/gens-0*-of-*.parquet'))
bad = sum(pq.read_table(f).num_rows for f in glob.glob('$SCRATCH/job/out/gens-failed-*.parquet'))
print(f'job rows: {ok} results, {bad} failed, of 64'); raise SystemExit(ok + bad != 64 or bad)" ;;
    llama8b) step llama8b 200 $PY -m pipeline.bench.gpu --device $DEVICE --shape ${BIG_SHAPE:-llama3-8b} --dtype bfloat16 \
      --sections single $BIG --include '^(HF assisted|ours, (draft|target alone)(, eager)?)$' --out "$OUT/bench" ;;
    # Also chained drafts, the defaults (compiled) against HF's compiled generate, and at the first B
    # rows admitted through eager padded prefills against graphs.
    t5) step t5 300 $PY -m pipeline.bench.gpu --device $DEVICE --shape ${T5_SHAPE:-t5-large} --dtype bfloat16 \
      --hf_compile --torch_compile --sections single,batched $BIG --batch_prompts 64 --batch_sizes 8,32 \
      --batch_max_new_tokens 32 --include '^(HF assisted|HF generate, static cache \+ compile|ours, (draft|target alone)(, eager)?|ours, draft, chained(, compiled|, eager prefills)?|ours, target alone, eager prefills)$' \
      --out "$OUT/bench" ;;
    # A sliding-window pair whose 128-token window every row passes: graphs against eager passes
    # (how such models ran on a GPU before static caches took sliding windows), at batch 1 and B = 8.
    window) step window 180 $PY -m pipeline.bench.gpu --device $DEVICE --shape ${WINDOW_SHAPE:-mistral-1.1b} \
      --dtype bfloat16 --sections single,batched $BIG --batch_prompts 64 --batch_sizes 8 --batch_max_new_tokens 32 \
      --include '^(ours, (draft|target alone)(, eager)?|ours, draft, chained)$' --out "$OUT/bench" ;;
    *) echo "unknown step $s" >>"$LOG" ;;
  esac
}
for s in $STEPS; do run_step "$s"; done
# PARALLEL: steps run side by side after STEPS (each under its own limit), for checks that time
# nothing, so that they share one call: e.g. PARALLEL="tests tests-compiled job".
for s in ${PARALLEL:-}; do run_step "$s" & done
wait
# At most 8 files come back from the GPU machine: the JSON holds every figure (the tables are
# rebuilt from it with `python -m pipeline.bench.gpu --report FILE`).
rm -f "$OUT"/bench/*.md "$OUT"/bench/*/*.md
rm -rf "$SCRATCH/job"
echo "each step's whole output: $SCRATCH" >>"$LOG"
ls -R "$OUT" >>"$LOG"
