"""A draft/target model pair, and prompts for it, made on the spot from text every machine has.

The offline demo (``python -m pipeline.demo``) needs a target and a draft that share one
tokenizer, without any model hub. This module trains both on the Python standard library's
own sources (``sysconfig.get_paths()['stdlib']``), holding out a deterministic tenth of the
files; the demo prompts ("continue this code") come from those held-out files only.

Layout under ``WORKDIR/models``::

    target/   an ordinary Hugging Face directory (config, safetensors, tokenizer files)
              plus DEMO_MARKER, written last
    draft/    the same, for the draft

``ensure_demo_models`` trains on first use and reuses the cache afterwards. A cached model is
reused only if its marker is present, its recipe hash matches the current recipe, its weights
file still has the checksum the marker records, and ``from_pretrained`` loads it; otherwise it
is rebuilt (the draft is rebuilt whenever the target is, since it is distilled from it).
Problems the user must fix (an unwritable work directory, no stdlib sources) raise
``DemoSetupError`` whose message is one line.

Recipe (full size; see ``FULL``): byte-level BPE with 1024 tokens; target Llama 8 layers x 256
(6.7M parameters, tied embeddings); draft Llama 2 layers x 256 (1.9M) that starts as the
target's embedding, first two blocks and final norm and is then distilled on the target's
logits (80% KL, 20% next-token loss), 85% of each batch being the target's own greedy
continuations of corpus snippets. Each training run stops at whichever comes first of a step
budget and a time budget, and the learning-rate schedule follows the same progress measure,
so a slow or busy machine still ends with an annealed model, only a less trained one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Busy-waiting OpenMP threads collapse throughput (5-10x here) when other processes share the
# cores; passive waiting costs little for training-sized ops. Only effective if torch is not yet
# imported, so entry points should import this module first; set later, it would only mislead
# whoever reads the environment (pipeline.bench reports it).
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

logger = logging.getLogger(__name__)

MARKER = "DEMO_MARKER.json"
WEIGHTS = "model.safetensors"
SPECIALS = ("<pad>", "<s>", "</s>")
RECIPE_VERSION = 1  # bump when the code changes what a recipe produces


class DemoSetupError(RuntimeError):
    """A problem with the environment, reported to the user as one line."""


# --------------------------------------------------------------------------------------------
# Recipes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    layers: int
    hidden: int
    heads: int
    intermediate: int
    kv_heads: int | None = None
    # Draft only: start from the target's embedding, first `layers` blocks and final norm
    # (the shapes must match), then distill. Same cost as a fresh model, far better agreement.
    init_from_target: bool = False


@dataclass(frozen=True)
class TrainSpec:
    max_steps: int
    max_seconds: float
    batch_size: int
    lr: float
    warmup_frac: float = 0.05
    final_lr_frac: float = 0.1
    weight_decay: float = 0.1
    kd_weight: float = 0.0  # weight of the distillation term in the draft loss; 0 = plain next-token loss
    kd_mode: str = "kl"  # "kl": KL(target || draft); "argmax": cross-entropy on the target's greedy choices
    # Draft only: also train on the target's own greedy continuations of corpus snippets, the
    # text the draft has to predict at generation time (loops and all). `rollouts` sequences,
    # each `rollout_prompt` corpus tokens + greedy tokens up to the training length; a batch
    # takes `rollout_frac` of its rows from them.
    rollouts: int = 0
    rollout_prompt: int = 64
    rollout_frac: float = 0.5


@dataclass(frozen=True)
class Recipe:
    name: str
    vocab_size: int
    seq_len: int  # training context; prompt + new tokens should stay within it
    max_position_embeddings: int
    tokenizer_train_bytes: int  # text used to learn the BPE merges
    corpus_bytes: int  # training text tokenized for the models
    heldout_mod: int  # a file is held out when sha1(relpath) % heldout_mod == 0
    target: ModelSpec
    draft: ModelSpec
    target_train: TrainSpec
    draft_train: TrainSpec
    max_file_bytes: int = 300_000
    seed: int = 1234

    def hash(self, part: str) -> str:
        """A hash of everything that determines the models (not the run's timings)."""
        payload = {
            "version": RECIPE_VERSION,
            "recipe": dataclasses.asdict(self),
            "part": part,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",  # the stdlib is the data
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


FULL = Recipe(
    name="full",
    vocab_size=1024,
    seq_len=256,
    max_position_embeddings=512,
    tokenizer_train_bytes=3_000_000,
    corpus_bytes=8_000_000,
    heldout_mod=10,
    target=ModelSpec(layers=8, hidden=256, heads=4, intermediate=704),
    draft=ModelSpec(layers=2, hidden=256, heads=4, intermediate=704, init_from_target=True),
    # Step budgets bind on a 2-core Xeon with AMX (about 220 s and 180 s), so every run there
    # trains as long; the time budgets only cap slower machines. With time budgets binding, three
    # fresh runs got 379-392 / 576-625 steps and acceptance 0.596-0.661; with these, 0.628-0.686
    # (training is not bit-reproducible: multithreaded bf16 kernels).
    target_train=TrainSpec(max_steps=390, max_seconds=300, batch_size=8, lr=4e-3),
    draft_train=TrainSpec(max_steps=620, max_seconds=240, batch_size=8, lr=2e-3, kd_weight=0.8,
                          rollouts=128, rollout_prompt=64, rollout_frac=0.85),
)

TINY = Recipe(
    name="tiny",
    vocab_size=384,
    seq_len=64,
    max_position_embeddings=256,
    tokenizer_train_bytes=200_000,
    corpus_bytes=300_000,
    heldout_mod=10,
    target=ModelSpec(layers=2, hidden=64, heads=2, intermediate=128),
    draft=ModelSpec(layers=1, hidden=64, heads=2, intermediate=128, init_from_target=True),
    target_train=TrainSpec(max_steps=60, max_seconds=15, batch_size=8, lr=3e-3),
    draft_train=TrainSpec(max_steps=40, max_seconds=10, batch_size=8, lr=3e-3, kd_weight=0.8,
                          rollouts=8, rollout_prompt=16, rollout_frac=0.5),
)


def recipe_for(tiny: bool) -> Recipe:
    return TINY if tiny else FULL


# --------------------------------------------------------------------------------------------
# Data: the standard library's sources
# --------------------------------------------------------------------------------------------

_SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "encodings",
               "pydoc_data", "__pycache__", "turtledemo", "ensurepip"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None, max_file_bytes: int = 300_000) -> list[str]:
    """Relative paths of the stdlib's own ``.py`` files, sorted (deterministic for one Python)."""
    root = root or stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_PARTS and not d.startswith("."))
        for name in filenames:
            if not name.endswith(".py"):
                continue
            path = Path(dirpath) / name
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if 200 <= size <= max_file_bytes:
                out.append(path.relative_to(root).as_posix())
    return sorted(out)


def is_heldout(relpath: str, heldout_mod: int) -> bool:
    return int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % heldout_mod == 0


def split_files(files: Sequence[str], heldout_mod: int) -> tuple[list[str], list[str]]:
    """(train, held-out): a stable split by a hash of each relative path."""
    train = [f for f in files if not is_heldout(f, heldout_mod)]
    held = [f for f in files if is_heldout(f, heldout_mod)]
    return train, held


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _spread(files: list[str], budget: int, root: Path) -> list[str]:
    """Texts from files taken in a fixed interleaved order (spread over the library) until `budget` bytes."""
    # A stride walk visits every file once but mixes packages, so a budget cut keeps variety.
    n = len(files)
    stride = 7 if n % 7 else 11
    order = [files[(i * stride) % n] for i in range(n)] if n else []
    texts, total = [], 0
    for rel in order:
        if total >= budget:
            break
        text = _read(root, rel)
        if text:
            texts.append(text)
            total += len(text)
    return texts


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def train_tokenizer(texts: Sequence[str], vocab_size: int, model_max_length: int):
    """Byte-level BPE with <pad>, <s>, </s>, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def tokenize_corpus(tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """One long int tensor: every text's tokens followed by EOS."""
    eos = tokenizer.eos_token_id
    flat: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(list(texts), add_special_tokens=False):
        flat.extend(enc.ids)
        flat.append(eos)
    return torch.tensor(flat, dtype=torch.long)


# --------------------------------------------------------------------------------------------
# Models and training
# --------------------------------------------------------------------------------------------


def make_model(spec: ModelSpec, tokenizer, recipe: Recipe, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads or spec.heads,
        max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    gc = model.generation_config
    gc.do_sample = False
    gc.pad_token_id = tokenizer.pad_token_id
    gc.eos_token_id = tokenizer.eos_token_id
    gc.bos_token_id = tokenizer.bos_token_id
    return model


def init_draft_from_target(draft, target) -> None:
    """Copy the target's embedding, final norm and first blocks into `draft` (shapes must match)."""
    t_state = target.state_dict()
    own = draft.state_dict()
    copied = {k: v for k, v in t_state.items() if k in own and own[k].shape == v.shape}
    missing = [k for k in own if k not in copied]
    if missing:
        raise ValueError(f"draft init from target: no matching weights for {missing[:3]}")
    draft.load_state_dict(copied)


@torch.inference_mode()
def target_rollouts(target, data: torch.Tensor, n: int, prompt_len: int, total_len: int, seed: int,
                    batch: int = 32) -> torch.Tensor:
    """`n` sequences of `total_len` tokens: a corpus snippet, then the target's greedy continuation."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    t0 = time.monotonic()
    for i in range(0, n, batch):
        b = min(batch, n - i)
        starts = torch.randint(0, len(data) - prompt_len, (b,), generator=gen)
        x = torch.stack([data[s:s + prompt_len] for s in starts.tolist()])
        new = total_len - prompt_len
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=_bf16_ok()):
            y = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new,
                                min_new_tokens=new, pad_token_id=target.config.pad_token_id)
        out.append(y[:, :total_len])
    logger.info("draft: %d greedy target continuations for distillation in %s", n, _fmt_s(time.monotonic() - t0))
    return torch.cat(out)


def _bf16_ok() -> bool:
    """bf16 autocast only where the CPU has native bf16 (AVX512-BF16/AMX); it is slower elsewhere."""
    if os.environ.get("SPECDEC_DEMO_BF16", "auto") == "0":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and \
            torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX")
    except Exception:  # noqa: BLE001 - any doubt means fp32
        return False


def _fmt_s(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def train_lm(model, data: torch.Tensor, spec: TrainSpec, seq_len: int, seed: int, name: str,
             teacher=None, log_every_s: float = 10.0, rollouts: torch.Tensor | None = None) -> dict:
    """Train `model` on random windows of `data`; stop at spec.max_steps or spec.max_seconds.

    Progress = max(step / max_steps, elapsed / max_seconds) drives the learning-rate schedule
    (linear warm-up, cosine decay to final_lr_frac) and the ETA in the log lines.
    With `teacher`, the loss mixes next-token cross-entropy and KL(teacher || model).
    """
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=spec.lr, betas=(0.9, 0.95))
    use_bf16 = _bf16_ok()
    model.train()
    if teacher is not None:
        teacher.eval()
    n_windows = len(data) - seq_len - 1
    if n_windows <= 0:
        raise DemoSetupError(f"training corpus too small ({len(data)} tokens) for {seq_len}-token windows")
    start = time.monotonic()
    last_log = start
    ema = None
    step = 0
    logger.info("%s: training %.1fM parameters, up to %d steps or %s, batch %dx%d, bf16=%s",
                name, sum(p.numel() for p in model.parameters()) / 1e6, spec.max_steps,
                _fmt_s(spec.max_seconds), spec.batch_size, seq_len, use_bf16)
    while True:
        elapsed = time.monotonic() - start
        progress = max(step / spec.max_steps, elapsed / spec.max_seconds)
        if progress >= 1.0:
            break
        if progress < spec.warmup_frac:
            lr = spec.lr * max(progress / spec.warmup_frac, 0.02)
        else:
            t = (progress - spec.warmup_frac) / (1 - spec.warmup_frac)
            lr = spec.lr * (spec.final_lr_frac + (1 - spec.final_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))
        for g in opt.param_groups:
            g["lr"] = lr
        n_roll = 0 if rollouts is None else min(spec.batch_size, round(spec.batch_size * spec.rollout_frac))
        starts = torch.randint(0, n_windows, (spec.batch_size - n_roll,), generator=gen)
        rows = [data[s:s + seq_len + 1] for s in starts.tolist()]
        if n_roll:
            rows += list(rollouts[torch.randint(0, len(rollouts), (n_roll,), generator=gen)])
        batch = torch.stack(rows)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(input_ids=x).logits
        logits = logits.float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss = ce
        if teacher is not None and spec.kd_weight > 0:
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
                t_logits = teacher(input_ids=x).logits
            if spec.kd_mode == "argmax":
                kd = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t_logits.argmax(-1).reshape(-1))
            else:
                t_logp = F.log_softmax(t_logits.float(), dim=-1).clone()
                kd = F.kl_div(F.log_softmax(logits, dim=-1).reshape(-1, logits.shape[-1]),
                              t_logp.reshape(-1, logits.shape[-1]), log_target=True, reduction="batchmean")
            loss = (1 - spec.kd_weight) * ce + spec.kd_weight * kd
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = ce.item() if ema is None else 0.9 * ema + 0.1 * ce.item()
        now = time.monotonic()
        if now - last_log >= log_every_s:
            last_log = now
            elapsed = now - start
            progress = max(step / spec.max_steps, elapsed / spec.max_seconds)
            eta = elapsed * (1 - progress) / max(progress, 1e-9)
            logger.info("%s: step %d/%d (%d%%) loss %.3f lr %.2e elapsed %s ETA %s", name, step,
                        spec.max_steps, int(100 * progress), ema, lr, _fmt_s(elapsed), _fmt_s(eta))
    model.eval()
    seconds = time.monotonic() - start
    logger.info("%s: done, %d steps in %s, loss %.3f", name, step, _fmt_s(seconds), ema or float("nan"))
    return {"steps": step, "train_seconds": round(seconds, 1), "final_loss": round(ema or float("nan"), 4),
            "bf16": use_bf16}


# --------------------------------------------------------------------------------------------
# Cache: markers, validation, atomic saves
# --------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_marker(model_dir: Path) -> dict | None:
    try:
        return json.loads((model_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None


def validate_cached(model_dir: Path, recipe_hash: str) -> str | None:
    """None if `model_dir` is a complete model of this recipe, else why not (one line)."""
    if not model_dir.is_dir():
        return "missing"
    marker = read_marker(model_dir)
    if marker is None:
        return "no completion marker (interrupted or foreign directory)"
    if marker.get("recipe_hash") != recipe_hash:
        return f"recipe changed ({marker.get('recipe_hash')} != {recipe_hash})"
    weights = model_dir / WEIGHTS
    try:
        if _sha256(weights) != marker.get("weights_sha256"):
            return f"{WEIGHTS} does not match its recorded checksum (corrupt or modified)"
    except OSError as e:
        return f"cannot read {WEIGHTS}: {e.strerror or e}"
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        AutoTokenizer.from_pretrained(model_dir)
        AutoModelForCausalLM.from_pretrained(model_dir)
    except Exception as e:  # noqa: BLE001 - any load failure means rebuild
        return f"does not load: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as e:
        raise DemoSetupError(f"cannot write to {directory}: {e.strerror or e}") from None


def _save_atomic(model, tokenizer, dest: Path, marker: dict) -> None:
    """Save into a temporary sibling, write the marker last, then swap it into place."""
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = dict(marker, weights_sha256=_sha256(tmp / WEIGHTS))
        (tmp / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.replace(dest, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, dest)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DemoSetupError(f"cannot save model to {dest}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --------------------------------------------------------------------------------------------
# The public entry points
# --------------------------------------------------------------------------------------------

# How many times the models were (re)trained in this process: tests use it to check reuse.
TRAIN_COUNTS = {"tokenizer": 0, "target": 0, "draft": 0}


def _corpus(recipe: Recipe) -> tuple[Path, list[str], list[str]]:
    root = stdlib_root()
    files = stdlib_files(root, recipe.max_file_bytes)
    train, held = split_files(files, recipe.heldout_mod)
    if len(train) < 5 or not held:
        raise DemoSetupError(f"too few Python sources under the stdlib directory {root} "
                             f"({len(files)} found) to train the demo models")
    return root, train, held


def ensure_demo_models(workdir: Path, tiny: bool = False, recipe: Recipe | None = None) -> tuple[Path, Path]:
    """Return (target_dir, draft_dir) under workdir/models, training them if not validly cached.

    Both are ordinary Hugging Face directories holding the same tokenizer. Training logs
    progress through `logging` (logger ``pipeline.demo_models``) at INFO.
    Raises DemoSetupError (one-line message) when the work directory cannot be written.
    """
    recipe = recipe or recipe_for(tiny)
    workdir = Path(workdir)
    models = workdir / "models"
    target_dir, draft_dir = models / "target", models / "draft"
    t_hash = recipe.hash("target")

    target_problem = validate_cached(target_dir, t_hash)
    d_hash = None
    if target_problem is None:
        d_hash = _draft_hash(recipe, target_dir)
        if validate_cached(draft_dir, d_hash) is None:
            logger.info("using cached demo models in %s", models)
            return target_dir, draft_dir

    _check_writable(models)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    root, train_files, _ = _corpus(recipe)
    if target_problem is None:
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        target = AutoModelForCausalLM.from_pretrained(target_dir)
        target_info = read_marker(target_dir) or {}
    else:
        if target_problem != "missing":
            logger.warning("cached target in %s is unusable (%s); rebuilding", target_dir, target_problem)
        logger.info("building the demo models (%s recipe) from %d stdlib files under %s",
                    recipe.name, len(train_files), root)
        tokenizer = train_tokenizer(_spread(train_files, recipe.tokenizer_train_bytes, root),
                                    recipe.vocab_size, recipe.max_position_embeddings)
        TRAIN_COUNTS["tokenizer"] += 1
        target = None
    texts = _spread(train_files, recipe.corpus_bytes, root)
    data = tokenize_corpus(tokenizer, texts)
    logger.info("tokenizer: %d tokens of vocabulary; corpus %.2fM tokens from %d files (%.1f MB); %s",
                len(tokenizer), len(data) / 1e6, len(texts), sum(map(len, texts)) / 1e6,
                _fmt_s(time.monotonic() - t0))

    if target is None:
        target = make_model(recipe.target, tokenizer, recipe, seed=recipe.seed)
        info = train_lm(target, data, recipe.target_train, recipe.seq_len, recipe.seed + 1, "target")
        TRAIN_COUNTS["target"] += 1
        target_info = {"recipe_hash": t_hash, "recipe": recipe.name, "role": "target", **info,
                       "params": sum(p.numel() for p in target.parameters())}
        _save_atomic(target, tokenizer, target_dir, target_info)
        d_hash = _draft_hash(recipe, target_dir)
    else:
        draft_problem = validate_cached(draft_dir, d_hash)
        if draft_problem != "missing":
            logger.warning("cached draft in %s is unusable (%s); rebuilding", draft_dir, draft_problem)

    draft = make_model(recipe.draft, tokenizer, recipe, seed=recipe.seed + 2)
    if recipe.draft.init_from_target:
        init_draft_from_target(draft, target)
    rollouts = None
    if recipe.draft_train.rollouts:
        rollouts = target_rollouts(target, data, recipe.draft_train.rollouts, recipe.draft_train.rollout_prompt,
                                   recipe.seq_len + 1, recipe.seed + 4)
    info = train_lm(draft, data, recipe.draft_train, recipe.seq_len, recipe.seed + 3, "draft", teacher=target,
                    rollouts=rollouts)
    TRAIN_COUNTS["draft"] += 1
    _save_atomic(draft, tokenizer, draft_dir, {"recipe_hash": d_hash, "recipe": recipe.name, "role": "draft",
                                                **info, "params": sum(p.numel() for p in draft.parameters())})
    logger.info("demo models ready in %s (%s in all)", models, _fmt_s(time.monotonic() - t0))
    return target_dir, draft_dir


def _draft_hash(recipe: Recipe, target_dir: Path) -> str:
    """The draft depends on the recipe and on the exact target it was distilled from."""
    marker = read_marker(target_dir) or {}
    return hashlib.sha256((recipe.hash("draft") + str(marker.get("weights_sha256"))).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------

_DEF = re.compile(r"^(\s*)(async\s+)?def\s+\w+\s*\(.*\)\s*(->.*)?:\s*$")


def _count(tokenizer, text: str) -> int:
    return len(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)


def _fit_tail(tokenizer, lines: list[str], end: int, max_tokens: int, min_lines: int) -> str | None:
    """The longest run of whole lines ending at `end` (inclusive) that fits `max_tokens` tokens."""
    lo, hi = max(0, end + 1 - 80), end + 1 - min_lines  # candidate start lines; fewer lines = fewer tokens
    if hi < lo or _count(tokenizer, "".join(lines[hi:end + 1])) > max_tokens:
        return None
    while lo < hi:  # smallest start that fits
        mid = (lo + hi) // 2
        if _count(tokenizer, "".join(lines[mid:end + 1])) <= max_tokens:
            hi = mid
        else:
            lo = mid + 1
    return "".join(lines[lo:end + 1])


def make_prompts(tokenizer, n: int, max_prompt_tokens: int = 128, min_context_lines: int = 4,
                 heldout_mod: int | None = None) -> list[dict]:
    """`n` "continue this code" prompts from held-out stdlib files.

    Each prompt is the code leading up to and including a one-line ``def ...:`` header (trimmed
    from the top to at most `max_prompt_tokens` tokens, whole lines, no final newline), so the
    job is to write the body. Files are visited in a fixed order and take turns, so prompts come from many files.
    """
    heldout_mod = heldout_mod or FULL.heldout_mod
    root = stdlib_root()
    _, held = split_files(stdlib_files(root), heldout_mod)
    files = []
    for rel in held:
        text = _read(root, rel)
        if not text:
            continue
        lines = text.splitlines(keepends=True)
        defs = [i for i, line in enumerate(lines) if i >= min_context_lines and _DEF.match(line)]
        if defs:
            # spread the picks through the file: every 3rd header, starting with the 2nd
            files.append((rel, lines, defs[1::3] or defs))
    out: list[dict] = []
    depth = 0
    while len(out) < n and any(depth < len(d) for _, _, d in files):
        for rel, lines, defs in files:
            if depth < len(defs) and len(out) < n:
                prompt = _fit_tail(tokenizer, lines, defs[depth], max_prompt_tokens, min_context_lines)
                # End at the header's colon, not after its newline: a prompt ending in a bare "\n"
                # token is a place the models have rarely seen (in training the newline merges with
                # the next line's indentation), and they answer it with blank lines.
                prompt = prompt.rstrip() if prompt else prompt
                if prompt and prompt.strip():
                    out.append({"prompt": prompt, "source_file": rel, "source_line": defs[depth] + 1})
        depth += 1
    if len(out) < n:
        raise DemoSetupError(f"only {len(out)} demo prompts could be made from held-out stdlib files "
                             f"({n} asked)")
    for i, row in enumerate(out):
        row["id"] = f"stdlib-{i:04d}"
    return out


def write_demo_prompts(workdir: Path, n: int, tokenizer, tiny: bool = False,
                       max_prompt_tokens: int | None = None) -> Path:
    """Write workdir/prompts.parquet: columns id, prompt, source_file, source_line (deterministic)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    recipe = recipe_for(tiny)
    if max_prompt_tokens is None:
        max_prompt_tokens = recipe.seq_len // 2
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    rows = make_prompts(tokenizer, n, max_prompt_tokens, heldout_mod=recipe.heldout_mod)
    workdir = Path(workdir)
    _check_writable(workdir)
    table = pa.table({
        "id": pa.array([r["id"] for r in rows], pa.string()),
        "prompt": pa.array([r["prompt"] for r in rows], pa.string()),
        "source_file": pa.array([r["source_file"] for r in rows], pa.string()),
        "source_line": pa.array([r["source_line"] for r in rows], pa.int32()),
    })
    dest = workdir / "prompts.parquet"
    tmp = workdir / f".prompts.parquet.tmp-{os.getpid()}"
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, dest)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DemoSetupError(f"cannot write {dest}: {e.strerror or e}") from None
    return dest


__all__ = [
    "FULL", "TINY", "DemoSetupError", "ModelSpec", "Recipe", "TrainSpec", "ensure_demo_models",
    "make_prompts", "recipe_for", "split_files", "stdlib_files", "train_tokenizer", "validate_cached",
    "write_demo_prompts",
]


def _main(argv: Sequence[str] | None = None) -> int:  # a convenience for experiments
    import argparse

    ap = argparse.ArgumentParser(description="Build (or validate) the demo draft/target pair.")
    ap.add_argument("--workdir", default="specdec-demo")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompts", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        t, d = ensure_demo_models(Path(args.workdir), tiny=args.tiny)
        if args.prompts:
            print(write_demo_prompts(Path(args.workdir), args.prompts, t, tiny=args.tiny))
    except DemoSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(t, d)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

