"""Text in, text and statistics out: the engine behind a tokenizer, usable from a notebook.

`TextGenerator.generate` returns a plain dict so it can cross a process boundary (Beam's
large-model proxy exposes methods only), and raises a `PromptError` subclass, whose class
name becomes the failed row's `error_type`, for prompts that cannot be generated, or
`ItemTimeout` for an item that runs past its time limit.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cpu_speed import DRAFT_DTYPES, draft_in_dtype, prepare_for_cpu
from specdec_core.cross_tokenizer import CrossTokenizerDrafter
from specdec_core.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter, input_embeddings
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import AdaptiveGamma, GammaPolicy
from specdec_core.loading import (
    SAME_TOKENIZER,
    ModelRefused,
    check_pair,
    context_limit,
    describe_mode,
    draft_tokenizer_for,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
    share_encoder,
)
from specdec_core.placement import DTYPE_BYTES, check_device, check_device_map, parameter_count
from specdec_core.plan import GRAPH_MODES, compiles
from specdec_core.processing import SamplingSettings, config_sampling, unapplied
from specdec_core.rows import Generation, ItemTimeout  # noqa: F401 (ItemTimeout: re-exported)
from specdec_core.stopping import StopStrings, check_stop_strings, cut_at_stop

DRAFTERS = ("model", "ngram", "none")
GAMMA_POLICIES = ("auto", "fixed", "adaptive")
CPU_KERNELS = ("prepacked", "stock")
ROLES = ("system", "user", "assistant")
# The ItemStats a result dict carries, in its order between the generation and the seed (DESIGN.md defines each).
STAT_COLUMNS = ("new_tokens", "prompt_tokens", "draft_tokens", "accepted_tokens", "acceptance_rate", "verify_steps",
                "draft_steps", "latency_s", "ttft_s", "prefill_s", "draft_s", "verify_s", "admit_s", "admitted_with",
                "admit_passes", "rejections", "tokens_per_s", "finish_reason")

log = logging.getLogger(__name__)


class PromptError(ValueError):
    """A row whose prompt cannot be generated; the job goes on."""


# One subclass per reason, its name the failed row's `error_type` (type() sets its module here, as `class` would).
# ChatTemplateError: the tokenizer's chat template refused the conversation (e.g. roles that do not alternate).
NullPrompt = type("NullPrompt", (PromptError,), {})
InvalidPromptType = type("InvalidPromptType", (PromptError,), {})
EmptyPrompt = type("EmptyPrompt", (PromptError,), {})
InvalidCharacters = type("InvalidCharacters", (PromptError,), {})
InvalidUtf8 = type("InvalidUtf8", (PromptError,), {})
PromptTooLong = type("PromptTooLong", (PromptError,), {})
TokenNotEmbedded = type("TokenNotEmbedded", (PromptError,), {})
EmptyConversation = type("EmptyConversation", (PromptError,), {})
UnknownRole = type("UnknownRole", (PromptError,), {})
InvalidMessage = type("InvalidMessage", (PromptError,), {})
ChatTemplateError = type("ChatTemplateError", (PromptError,), {})


@dataclass(frozen=True)
class NotUtf8:
    """In place of a row's prompt when a value of the row is not valid UTF-8 (a corrupt file, or a
    writer that does not check): the row fails, never the job."""

    columns: tuple[str, ...]
    shown: str | None  # the prompt with U+FFFD for its bad bytes, for the failed row

    @property
    def reason(self) -> str:
        return f"not valid UTF-8 in column {', '.join(map(repr, self.columns))} of the input"


def _check_characters(value: str, what: str) -> None:
    """Control characters but whitespace (tab, newlines, form feed: a scraped page's breaks) mark binary junk, and a
    lone surrogate cannot be encoded."""
    bad = sorted({c for c in value if unicodedata.category(c) in ("Cc", "Cs") and not c.isspace()})
    if bad:
        raise InvalidCharacters(f"{what} contains control characters {', '.join(repr(c) for c in bad[:5])}")


def check_prompt(value: object) -> str:
    """The prompt as a string, or a PromptError saying why it is not usable."""
    if value is None:
        raise NullPrompt("prompt is null")
    if isinstance(value, NotUtf8):
        raise InvalidUtf8(value.reason)
    if not isinstance(value, str):
        raise InvalidPromptType(f"prompt is {type(value).__name__}, expected a string")
    if not value.strip():
        raise EmptyPrompt("prompt is empty or whitespace only")
    _check_characters(value, "prompt")
    return value


def is_conversation(value: object) -> bool:
    """A list of messages (a Parquet list of {role, content} structs), as opposed to a text prompt."""
    return isinstance(value, list | tuple)


def check_conversation(value: object) -> list[dict[str, str]]:
    """The conversation as [{role, content}] messages (a text prompt: one user message), or a PromptError naming the
    bad message. Only `role` and `content` go to the chat template."""
    if not is_conversation(value):
        return [{"role": "user", "content": check_prompt(value)}]
    if not value:
        raise EmptyConversation("conversation has no messages")
    messages = []
    for i, message in enumerate(value, 1):
        if not isinstance(message, dict):
            raise InvalidMessage(f"message {i} is {type(message).__name__}, expected a {{role, content}} struct")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise UnknownRole(f"message {i} has role {role!r}, expected one of {', '.join(ROLES)}")
        if content is None:
            raise InvalidMessage(f"message {i} ({role}) has no content")
        if not isinstance(content, str):
            raise InvalidMessage(f"message {i} ({role}) content is {type(content).__name__}, expected a string")
        _check_characters(content, f"message {i} ({role})")
        messages.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in messages):
        raise EmptyConversation("every message of the conversation is empty")
    return messages


@dataclass(frozen=True)
class GeneratorSpec:
    """Everything needed to build a TextGenerator in a worker; plain data, so it pickles."""

    target_model: str
    draft_model: str | None = None
    tokenizer: str | None = None
    drafter: str = "model"
    num_speculative_tokens: int = 4
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    ngram_max_size: int = 3
    ngram_min_size: int = 1
    device: str = "auto"
    dtype: str = "auto"
    gamma_policy: str = "fixed"
    cpu_kernels: str = "prepacked"
    cuda_graphs: str = "auto"
    torch_compile: str = "auto"
    draft_dtype: str = "auto"
    chat_template: bool = False
    system_prompt: str | None = None
    stop: tuple[str, ...] = ()
    max_item_seconds: float | None = None
    trust_remote_code: bool = False
    batch_size: int = 1
    device_map: str = "none"
    # One copy's devices, from the worker's placement: the target split over them, the draft on the first. (): --device
    devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"--device {self.device!r}: expected auto, cpu, cuda or cuda:N")
        check_device_map(self.device_map)
        if self.device_map == "auto" and self.device == "cpu":
            raise ValueError("--device_map auto splits a model over GPUs: not with --device cpu")
        if self.batch_size < 1:
            raise ValueError(f"--batch_size must be >= 1, got {self.batch_size}")
        check_stop_strings(self.stop)
        if self.max_item_seconds is not None and not self.max_item_seconds > 0:
            raise ValueError(f"--max_item_seconds must be > 0, got {self.max_item_seconds}")
        for flag, choices in (("gamma_policy", GAMMA_POLICIES), ("draft_dtype", DRAFT_DTYPES),
                              ("cuda_graphs", GRAPH_MODES), ("torch_compile", GRAPH_MODES),
                              ("cpu_kernels", CPU_KERNELS), ("drafter", DRAFTERS)):
            if getattr(self, flag) not in choices:
                raise ValueError(f"--{flag} {getattr(self, flag)!r}: expected one of {', '.join(choices)}")
        if self.draft_dtype == "int8" and self.device.startswith("cuda"):
            raise ValueError("--draft_dtype int8 is dynamic quantization, CPU only: not with --device cuda")
        if self.torch_compile == "on" and self.cuda_graphs == "off":
            raise ValueError("--torch_compile on compiles the passes over static caches: not with --cuda_graphs off")
        if self.torch_compile == "on" and self.cuda_graphs == "auto" and self.device == "cpu":
            raise ValueError("--torch_compile on compiles the passes over static caches, which --cuda_graphs auto "
                             "takes on a GPU only: not with --device cpu (--cuda_graphs on compiles them on a CPU)")
        if self.gamma_policy == "adaptive" and self.temperature != 0:
            raise ValueError("--gamma_policy adaptive needs --temperature 0: its timing-driven gammas would "
                             "stop a seed from reproducing its sample (auto uses fixed when sampling)")
        if self.drafter == "model" and not self.draft_model:
            raise ValueError("--drafter model needs --draft_model")
        if self.drafter == "ngram" and not 1 <= self.ngram_min_size <= self.ngram_max_size:
            raise ValueError(f"--ngram_min_size {self.ngram_min_size} and --ngram_max_size {self.ngram_max_size}: "
                             "need 1 <= --ngram_min_size <= --ngram_max_size")
        SamplingSettings(self.temperature, self.top_k, self.top_p)  # validates


def load_model_drafter(path: str, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *,
                       device: torch.device, dtype: torch.dtype, draft_dtype: str = "auto", sampled: bool = False,
                       cpu_kernels: str = "stock", trust_remote_code: bool = False,
                       cuda_graphs: str = "auto", torch_compile: bool = False) -> Drafter:
    """A draft model checked against its target: same-tokenizer or cross-tokenizer drafting
    (logged), in its dtype and kernels; one place for the job and pipeline.tune."""
    draft = load_model(path, device, dtype, trust_remote_code=trust_remote_code)
    draft_tokenizer = draft_tokenizer_for(path, tokenizer, trust_remote_code)
    mode = check_pair(target, draft, tokenizer, draft_tokenizer)
    log.info("--draft_model %s: %s", path, describe_mode(mode, tokenizer, draft_tokenizer))
    draft = draft_in_dtype(draft, draft_dtype, sampled)
    if cpu_kernels == "prepacked":
        prepare_for_cpu(draft)
    if mode == SAME_TOKENIZER:
        # After the draft's dtype and kernels: an encoder they changed is not the target's.
        if share_encoder(target, draft):
            log.info("--draft_model %s: its encoder holds the target's weights; one encoder pass per prompt "
                     "serves both", path)
        # Compiled, draft steps run chained on the device (the fastest pairing); only its static cache compiles.
        return ModelDrafter(draft, cuda_graphs=cuda_graphs, chain=torch_compile,
                            torch_compile=torch_compile and cuda_graphs != "off")
    return CrossTokenizerDrafter(draft, tokenizer, draft_tokenizer)


class TextGenerator:
    """A loaded target (+ drafter) and tokenizer; thread-safe, one item (or one batched list of items) at a time."""

    def __init__(self, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, drafter: Drafter, *,
                 num_speculative_tokens: int = 4, max_new_tokens: int = 128,
                 sampling: SamplingSettings = SamplingSettings(), gamma_policy: GammaPolicy | None = None,
                 chat_template: bool = False, system_prompt: str | None = None, stop: Sequence[str] = (),
                 max_item_seconds: float | None = None, batch_size: int = 1, cuda_graphs: str = "auto",
                 torch_compile: bool = False):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.system_prompt = system_prompt
        self.stop = check_stop_strings(stop)
        self.max_item_seconds = max_item_seconds
        # A batched worker decodes through the batch engine only: the batch-1 engine then runs eagerly, so no static
        # cache is made, nor self-checked at load, for passes that never run.
        one = batch_size == 1
        both = dict(num_speculative_tokens=num_speculative_tokens, max_new_tokens=max_new_tokens, sampling=sampling)
        self.engine = SpeculativeGenerator(target, drafter, **both, gamma_policy=gamma_policy,
                                           cuda_graphs=cuda_graphs if one else "off",
                                           torch_compile=torch_compile and one)
        self.batch_engine = None
        if batch_size > 1:
            self.batch_engine = BatchSpeculativeGenerator(target, drafter, **both, batch_size=batch_size,
                                                          gamma_policy=self.engine.gamma_policy,
                                                          cuda_graphs=cuda_graphs, torch_compile=torch_compile)
        # Positions: the decoder's (a causal one holds prompt + output), and an encoder's prompt. Only the target's
        # bind a row: a draft with fewer stops drafting past its own.
        self.context = context_limit(target)
        self.prompt_context = context_limit(target, encoder=True) if target.config.is_encoder_decoder else None
        # The ids a prompt may hold: those the target embeds (a draft reads an id past its rows as its last row). A
        # checkpoint may embed fewer tokens than its tokenizer has (bart-large-cnn leaves out <mask>); a prompt holding
        # one fails. None: no input embeddings to find (some remote code).
        weight = getattr(input_embeddings(target), "weight", None)
        self.embedded: int | None = None if weight is None else int(weight.shape[0])
        # Beam threads share one generator per process; items run one at a time so each one's latency is its own.
        self._lock = threading.Lock()
        # The devices holding the pair's parameters, probed after a CUDA error (`placement.check_device`).
        models = [target, getattr(drafter, "model", None)]
        self.devices = list(dict.fromkeys(p.device for m in models if m is not None for p in m.parameters()))

    @classmethod
    def load(cls, spec: GeneratorSpec, gamma_policy: GammaPolicy | None = None) -> TextGenerator:
        """The pair of `spec`, loaded and checked; `ModelRefused` says why it cannot run."""
        try:
            return cls._load(spec, gamma_policy)
        except ModelRefused:
            raise
        except ValueError as e:
            raise ModelRefused(str(e)) from e

    @classmethod
    def _load(cls, spec: GeneratorSpec, gamma_policy: GammaPolicy | None) -> TextGenerator:
        device = resolve_device(spec.devices[0] if spec.devices else spec.device)
        dtype = resolve_dtype(spec.dtype, device)
        trust = spec.trust_remote_code
        beside = 0  # bytes the draft takes on the first device of a split target
        if len(spec.devices) > 1 and spec.drafter == "model":
            from transformers import AutoConfig

            draft_config = AutoConfig.from_pretrained(spec.draft_model, trust_remote_code=trust)
            beside = parameter_count(draft_config, trust)[0] * DTYPE_BYTES.get(dtype, 4)
        target = load_model(spec.target_model, device, dtype, trust_remote_code=trust, devices=spec.devices,
                            first_extra=beside)
        if spec.cpu_kernels == "prepacked":
            prepare_for_cpu(target)  # no-op off CPU or outside fp32
        if ignored := unapplied(target.generation_config):
            log.warning("%s: its generation config asks for %s, which speculative decoding does not do: outputs "
                        "are those of generate() without them (greedy or sampled, one beam)", spec.target_model,
                        ", ".join(ignored))
        if spec.temperature == 0 and (flags := config_sampling(target.generation_config)):
            log.warning("%s: its generation config samples, and --temperature 0 decodes greedily (%s samples as its "
                        "generate() does by default)", spec.target_model, flags)
        tokenizer = load_tokenizer(spec.tokenizer or spec.target_model, trust_remote_code=trust)
        if spec.chat_template and not tokenizer.chat_template:
            raise ValueError(f"--chat_template: the tokenizer of {spec.tokenizer or spec.target_model} "
                             "has no chat template")
        compiled = compiles(spec.torch_compile, spec.cuda_graphs, device)
        if spec.drafter == "model":
            drafter: Drafter = load_model_drafter(spec.draft_model, target, tokenizer, device=device, dtype=dtype,
                                                  draft_dtype=spec.draft_dtype, sampled=spec.temperature > 0,
                                                  cpu_kernels=spec.cpu_kernels,
                                                  trust_remote_code=trust, torch_compile=compiled,
                                                  # (its own static cache serves one item at a time)
                                                  cuda_graphs=spec.cuda_graphs if spec.batch_size == 1 else "off")
        elif spec.drafter == "ngram":
            drafter = NgramDrafter(spec.ngram_max_size, spec.ngram_min_size)
        else:
            drafter = NoDrafter()
        # auto: adaptive when greedy (gamma never changes output); fixed when sampling, so a seed reproduces its sample.
        adaptive = spec.gamma_policy == "adaptive" or (spec.gamma_policy == "auto" and spec.temperature == 0)
        if gamma_policy is None and adaptive and spec.drafter != "none":
            gamma_policy = AdaptiveGamma(max_gamma=spec.num_speculative_tokens)
        sampling = SamplingSettings(spec.temperature, spec.top_k, spec.top_p)
        return cls(target, tokenizer, drafter, num_speculative_tokens=spec.num_speculative_tokens,
                   max_new_tokens=spec.max_new_tokens, sampling=sampling, gamma_policy=gamma_policy,
                   chat_template=spec.chat_template, system_prompt=spec.system_prompt, stop=spec.stop,
                   max_item_seconds=spec.max_item_seconds, batch_size=spec.batch_size, cuda_graphs=spec.cuda_graphs,
                   torch_compile=compiled)

    def encode(self, prompt: object) -> list[int]:
        """Prompt ids: the text's own tokens, or, for a conversation or with `chat_template`, the
        tokenizer's chat template applied with the generation prompt (exactly HF's ids)."""
        if is_conversation(prompt) or self.chat_template:
            ids = self.chat_ids(check_conversation(prompt))
        else:
            # verbose=False: no "indexing errors" warning; the length checks below fail such a row with its limit
            ids = self.tokenizer(check_prompt(prompt), verbose=False)["input_ids"]
        if not ids:
            raise EmptyPrompt("prompt tokenizes to no tokens")
        rows = self.embedded
        if rows is not None and max(ids) >= rows:
            token = self.tokenizer.convert_ids_to_tokens(max(ids))
            raise TokenNotEmbedded(f"prompt holds token {max(ids)} ({token!r}), which the target does not embed "
                                   f"(its embeddings have {rows} rows): a token its tokenizer has beyond its weights")
        n, budget = self.engine.max_new_tokens, self.context
        if not self.engine.target.config.is_encoder_decoder:
            if budget is not None and len(ids) + n > budget:
                raise PromptTooLong(f"prompt has {len(ids)} tokens; with max_new_tokens={n} "
                                    f"it exceeds the model's {budget}-position context")
            return ids
        if self.prompt_context is not None and len(ids) > self.prompt_context:
            raise PromptTooLong(f"prompt has {len(ids)} tokens; it exceeds the encoder's "
                                f"{self.prompt_context}-position context")
        if budget is not None and n > budget:  # the decoder holds the output
            raise PromptTooLong(f"max_new_tokens={n} exceeds the decoder's {budget}-position context")
        return ids

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """`apply_chat_template(messages, add_generation_prompt=True)`, --system_prompt first unless there is one."""
        if self.system_prompt is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        from jinja2 import TemplateError

        try:
            encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                         return_dict=True, tokenizer_kwargs={"verbose": False})
        except (TemplateError, ValueError) as e:  # the template's raise_exception(), or no template
            raise ChatTemplateError(f"chat template: {e}") from e
        return list(encoded["input_ids"])

    def generate(self, prompt: object, seed: int = 0) -> dict:
        """A result dict; a `PromptError` for a prompt that cannot be generated, `DeviceLost` once a
        CUDA error has left the pair's GPU failing every call, else the row's own error."""
        ids = self.encode(prompt)
        with self._lock:
            try:
                out = self.engine.generate(ids, seed, self._finish_check(), max_seconds=self.max_item_seconds)
            except Exception as e:
                check_device(e, self.devices)
                raise
        return self._as_dict(out, seed)

    def generate_batch(self, items: list[tuple[object, int]]) -> list[dict]:
        """(prompt, seed) per item -> one dict per item, in order: a result as `generate` gives, or {"error_type",
        "error_message"} for a bad prompt or a timeout, so that one bad row never fails the others."""
        if self.batch_engine is None:
            raise ValueError("generate_batch needs a TextGenerator built with batch_size > 1")
        encoded: list[tuple[list[int], int] | PromptError] = []
        for prompt, seed in items:
            try:
                encoded.append((self.encode(prompt), seed))
            except PromptError as e:
                encoded.append(e)
        decoded = iter(self._decode_together([x for x in encoded if not isinstance(x, PromptError)]))
        results = [x if isinstance(x, PromptError) else next(decoded) for x in encoded]
        return [{"error_type": type(g).__name__, "error_message": str(g)} if isinstance(g, Exception)
                else self._as_dict(g, seed) for g, (_, seed) in zip(results, items, strict=True)]

    def _decode_together(self, todo: list[tuple[list[int], int]]) -> list[Generation | Exception]:
        """The items decoded in one call; a call that raises is decoded again in halves, down to the item that raises
        alone, which gets its exception: the others decode as they would have (a row depends on its prompt and seed)."""
        with self._lock:
            try:
                checks = [self._finish_check() for _ in todo]  # (fresh: a check keeps its item's tokens)
                return self.batch_engine.generate_many(todo, checks, max_seconds=self.max_item_seconds)
            except Exception as e:  # (`DeviceLost`: every half would fail too; checked under the lock, as at batch 1:
                check_device(e, self.devices)  # another thread's graph capture forbids the check's kernel)
                error = e
        if len(todo) == 1:
            return [error]
        log.warning("a batched call of %d rows raised %s (%s): decoding them again in halves", len(todo),
                    type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "")
        half = len(todo) // 2
        return self._decode_together(todo[:half]) + self._decode_together(todo[half:])

    def _finish_check(self) -> StopStrings | None:
        """A fresh per-item stop-string check (it keeps the item's tokens), or None without --stop."""
        return StopStrings(self.tokenizer, self.stop) if self.stop else None

    def _as_dict(self, out: Generation, seed: int) -> dict:
        s = out.stats
        text = self.tokenizer.decode(out.tokens, skip_special_tokens=True)
        if s.finish_reason == "stop":
            text, _ = cut_at_stop(text, self.stop)
        return {"generation": text, "token_ids": out.tokens, **{c: getattr(s, c) for c in STAT_COLUMNS}, "seed": seed}
