"""Loading a target/draft pair with Hugging Face, and checking that the two can work together."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from specdec_core.decoder import decoder_start

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")
log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRefused(ValueError):
    """The pair cannot run as the job asks, found as a worker loads it (a pair check, a self-check): said in a line."""


class IncompatiblePairError(ModelRefused):
    """The draft cannot draft for the target (a different kind of model, or an output layer too small)."""


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is float32 on CPU (exact, and this CPU has no fast bf16) and bfloat16 on CUDA."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"--dtype {name}: expected auto or one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def load_model(path: str, device: torch.device, dtype: torch.dtype, trust_remote_code: bool = False, *,
               devices: Sequence[str] = (), first_extra: int = 0) -> PreTrainedModel:
    """A causal or encoder-decoder LM (as the config says) in eval mode on `device`, or split over several `devices`.
    trust_remote_code is passed explicitly, False included: left unset, transformers may ask on a terminal."""
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    if len(devices) > 1:
        device_map = load_split(model, list(devices), first_extra)
        spread = list(dict.fromkeys(device_map.values()))
        log.info("%s split over %s: %s", path, ", ".join(spread), ", ".join(
            f"{d} {sum(1 for v in device_map.values() if v == d)} modules" for d in spread))
        return model.eval()
    return model.to(device).eval()


def balanced_map(model: nn.Module, capacities: Sequence[int], first_extra: int = 0) -> dict[str, int]:
    """Module name -> index into `capacities` (bytes per device): accelerate's balanced map, blocks kept whole.
    The first device's share is less `first_extra` (the draft beside it) and holds the input embeddings, so the ids
    go in there. ValueError when the devices cannot hold the model."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import compute_module_sizes, get_balanced_memory, get_max_layer_size

    blocks = sorted(getattr(model, "_no_split_modules", None) or ())
    # accelerate numbers accelerators 0, 1, ...: here the devices' positions.
    budget = get_balanced_memory(model, max_memory=dict(enumerate(capacities)), no_split_module_classes=blocks)
    # The first share less the draft, never under the embeddings plus accelerate's room for its largest layer.
    embed = next(n for n, m in model.named_modules() if m is model.get_input_embeddings())
    sizes = compute_module_sizes(model)
    front = sizes[embed] + get_max_layer_size(list(model.named_children()), sizes, blocks)[0]
    budget[0] = min(max(budget[0] - first_extra, front), capacities[0] - first_extra)
    device_map = dict(infer_auto_device_map(model, max_memory=budget, no_split_module_classes=blocks))
    if off := sorted({str(d) for d in device_map.values() if not isinstance(d, int)}):
        raise ValueError(f"{type(model).__name__} does not fit {len(capacities)} device(s) "
                         f"({', '.join(f'{c / 2**30:.1f} GiB' for c in capacities)}): it would go to {', '.join(off)}")
    if device_map[max((k for k in device_map if k in ("", embed) or embed.startswith(k + ".")), key=len)] != 0:
        raise ValueError(f"{type(model).__name__}: its input embeddings do not fit the first device "
                         f"beside the draft's {first_extra:,} bytes")
    return device_map


def load_split(model: nn.Module, devices: list[str], first_extra: int = 0) -> dict[str, str]:
    """Split a model (loaded on the CPU) over `devices` with accelerate; returns the map (module name -> device).
    `dispatch_model`'s hooks move each block's inputs to its device and outputs back to the first; hooked even on one
    device named twice (a CPU), so that takes the same code path."""
    from accelerate import dispatch_model

    from specdec_core.placement import device_capacity

    device_map = {name: devices[i] for name, i in balanced_map(
        model, [device_capacity(d) for d in devices], first_extra).items()}
    dispatch_model(model, device_map, main_device=devices[0], force_hooks=True,
                   skip_keys=sorted(getattr(model, "_skip_keys_device_placement", None) or ()))
    return device_map


def load_tokenizer(path: str, trust_remote_code: bool = False, **kwargs) -> PreTrainedTokenizerBase:
    """Refused from a folder without the vocabulary its class reads: transformers builds one of special tokens alone
    (T5's 104, BART's 5), a tokenizer_config.json there or not, and every prompt becomes unknowns."""
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **kwargs)
    own = set(getattr(tokenizer, "vocab_files_names", {}).values())  # (none: a class that reads no file, ByT5's)
    if own and os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, n)) for n in {*own, "tokenizer.json"}):
        raise ModelRefused(f"{path!r} holds none of its tokenizer's vocabulary files ({', '.join(sorted(own))})")
    return tokenizer


def draft_tokenizer_for(draft_path: str, target_tokenizer: PreTrainedTokenizerBase,
                        trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The draft's own tokenizer, or the target's when the draft directory carries none (hub ids are assumed to)."""
    if os.path.isdir(draft_path) and not any(os.path.exists(os.path.join(draft_path, f)) for f in TOKENIZER_FILES):
        return target_tokenizer
    return load_tokenizer(draft_path, trust_remote_code)


SAME_TOKENIZER = "same-tokenizer"
CROSS_TOKENIZER = "cross-tokenizer"


def check_compatible(target_config: PretrainedConfig, draft_config: PretrainedConfig,
                     target_tokenizer: PreTrainedTokenizerBase, draft_tokenizer: PreTrainedTokenizerBase,
                     generation_configs: tuple = (None, None), rows: tuple | None = None) -> str:
    """The checks that need no weights (output rows from the configs where `rows` is not given), and the drafting
    mode: SAME_TOKENIZER when both tokenizers have one vocabulary, else CROSS_TOKENIZER (the draft's text re-encoded
    into target tokens). Vocabularies are compared through the tokenizers: checkpoints pad their embeddings (T5)."""
    kinds = [("encoder-decoder" if c.is_encoder_decoder else "causal") for c in (target_config, draft_config)]
    if kinds[0] != kinds[1]:
        raise IncompatiblePairError(f"the target is {kinds[0]} but the draft is {kinds[1]}; they must match")
    mode = SAME_TOKENIZER if target_tokenizer.get_vocab() == draft_tokenizer.get_vocab() else CROSS_TOKENIZER
    rows = rows or [getattr(c.get_text_config(), "vocab_size", None) for c in (target_config, draft_config)]
    if all(isinstance(n, int) for n in rows):
        _check_rows(mode, rows, (target_tokenizer, draft_tokenizer))
    if mode == SAME_TOKENIZER and target_config.is_encoder_decoder:
        starts = [decoder_start(c, g) for c, g in zip((target_config, draft_config), generation_configs, strict=True)]
        if starts[0] != starts[1]:
            raise IncompatiblePairError(f"decoder start tokens differ: target {starts[0]}, draft {starts[1]}")
    return mode


def output_rows(model: PreTrainedModel) -> int:
    """The rows of a model's output layer (its logits' width; a quantized layer's weight is a method; 0: unknown)."""
    layer = model.get_output_embeddings()
    weight = getattr(layer, "weight", None)
    return weight.shape[0] if isinstance(weight, torch.Tensor) else getattr(layer, "out_features", 0)


def check_draft_rows(target_rows: int, draft_rows: int) -> None:
    """A same-tokenizer draft may have fewer output rows than the target (padded to another multiple), never more: it
    could propose a token past the target's embedding (only prompt ids can lie past a model's rows, bart-large-cnn
    embeds no <mask>: `TextGenerator.encode` checks them)."""
    if 0 < target_rows < draft_rows:
        raise IncompatiblePairError(f"the draft's output layer has {draft_rows} rows, the target's {target_rows}: "
                                    "the draft could propose a token the target has no row for")


def _check_rows(mode: str, rows: list[int], tokenizers: tuple) -> None:
    """Same tokenizer: `check_draft_rows`. Cross-tokenizer, re-encoded text may hold any token of either tokenizer (a
    special token's text too): each needs a row."""
    if mode == SAME_TOKENIZER:
        check_draft_rows(*rows)
    for role, n, tok in zip(("target", "draft"), rows, tokenizers, strict=True):
        if mode == CROSS_TOKENIZER and n < len(tok):
            raise IncompatiblePairError(f"the {role}'s output layer has {n} rows for a {len(tok)}-token vocabulary, "
                                        "and cross-tokenizer drafting may meet any of its tokens: use a draft that "
                                        "shares the target's tokenizer")


def describe_mode(mode: str, target_tokenizer: PreTrainedTokenizerBase,
                  draft_tokenizer: PreTrainedTokenizerBase) -> str:
    """The log line that says which drafting mode a pair gets, and why."""
    if mode == SAME_TOKENIZER:
        return f"same-tokenizer drafting: the draft shares the target's {len(target_tokenizer)}-token vocabulary"
    return (f"cross-tokenizer drafting: the draft's vocabulary ({len(draft_tokenizer)} tokens) differs from the "
            f"target's ({len(target_tokenizer)} tokens); its text is re-encoded into target tokens, "
            "proposed deterministically and verified exactly")


def check_pair(target: PreTrainedModel, draft: PreTrainedModel, target_tokenizer: PreTrainedTokenizerBase,
               draft_tokenizer: PreTrainedTokenizerBase) -> str:
    """The drafting mode, or IncompatiblePairError when the draft cannot draft for the target."""
    return check_compatible(target.config, draft.config, target_tokenizer, draft_tokenizer,
                            (target.generation_config, draft.generation_config),
                            [output_rows(m) for m in (target, draft)])


def share_encoder(target: PreTrainedModel, draft: PreTrainedModel) -> bool:
    """Make an encoder-decoder draft run the target's encoder module if its own has the same weights; returns whether.
    One encoder pass per prompt then serves both (a draft cut from the target, LayerSkip-style); only the draft's
    inputs could change, never the output."""
    if not (target.config.is_encoder_decoder and draft.config.is_encoder_decoder):
        return False
    mine, theirs = draft.get_encoder(), target.get_encoder()
    if mine is theirs:
        return True
    a, b = mine.state_dict(), theirs.state_dict()
    if a.keys() != b.keys() or not all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype
                                       and a[k].device == b[k].device and torch.equal(a[k], b[k]) for k in a):
        return False
    name = next(n for n, m in draft.named_modules() if m is mine)
    parent, _, attr = name.rpartition(".")
    setattr(draft.get_submodule(parent), attr, theirs)
    return draft.get_encoder() is theirs


def context_limit(*models: PreTrainedModel, encoder: bool = False) -> int | None:
    """The longest decoder sequence every model can position, or with `encoder` the longest prompt its encoder can
    (LED: 16384 and 1024); None for relative positions (T5)."""
    return min((n for n in (_usable_positions(m, encoder) for m in models) if n is not None), default=None)


def _usable_positions(model: PreTrainedModel, encoder: bool) -> int | None:
    """`positions` of the model's config, less what a RoBERTa-style table spends before its first
    position: it numbers tokens from padding_idx + 1 (512 of roberta-base's 514 rows)."""
    n = positions(model.config, encoder)
    if n is None:
        return None
    for module in model.modules():
        table = getattr(module, "position_embeddings", None)
        if (isinstance(table, torch.nn.Embedding) and table.padding_idx is not None
                and callable(getattr(module, "create_position_ids_from_input_ids", None))):
            n = min(n, table.num_embeddings - table.padding_idx - 1)
    return n


def positions(config, encoder: bool = False) -> int | None:
    """The positions a model config's decoder (or `encoder`) can embed, or None. A config that
    holds its two halves' configs (`EncoderDecoderModel`'s, such as bert2bert) is read in the half."""
    own = ("max_encoder_position_embeddings", "max_source_positions") if encoder else \
        ("max_decoder_position_embeddings", "max_target_positions")
    for attr in (own[0], "max_position_embeddings", "n_positions", own[1]):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    half = getattr(config, "encoder" if encoder else "decoder", None)
    return positions(half, encoder) if isinstance(half, PretrainedConfig) else None


def item_seed(base_seed: int, item_id: object) -> int:
    """A 63-bit seed from the job's seed and the item's id, independent of order and sharding."""
    digest = hashlib.sha256(f"{base_seed}\x1f{item_id!r}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
