"""Drafting with a model whose tokenizer differs from the target's, still exact.

The draft continues the committed text greedily in its own tokens; its text is re-encoded with the target's
tokenizer and proposed as deterministic proposals (`Draft.q = None`), verified by the n-gram drafter's rule, which
is exact for any proposal that does not look at the verification's random numbers. So every alignment here (token
boundaries, tail windows, split UTF-8 characters, the draft cache's common prefix) is a heuristic that can only
cost speed (docs/cross-tokenizer.md)."""

from __future__ import annotations

import time

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec_core.batch_kv import BatchKV, feed_to, one_row
from specdec_core.decoder import eos_ids, initial_decoder_ids
from specdec_core.drafters import Draft, DraftSession, Picker, SessionDrafter, StepTimer
from specdec_core.loading import context_limit

_PARTIAL = "\ufffd"  # what an incomplete UTF-8 sequence decodes to
CONTEXT = 4  # tokens of context before a decoded suffix
TARGET_TAIL = 8  # committed target tokens re-encoded with the draft's text
DRAFT_WINDOW = 8  # draft tokens before the committed end that each round re-encodes


def _decode(tok: PreTrainedTokenizerBase, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def decode_suffix(tok: PreTrainedTokenizerBase, ids: list[int], start: int, context: int = CONTEXT) -> str | None:
    """The text ids[start:] add after ids[:start], decoding about `context` tokens before `start` (else all); None
    when no context's text prefixes the longer decode. A context starting inside a character is moved back: a
    byte-fallback decoder turns a whole run of byte tokens into U+FFFDs when the run starts inside one."""
    starts = [*range(max(0, start - context), max(0, start - 4 * context) - 1, -1), 0]
    for c in dict.fromkeys(starts):
        head = _decode(tok, ids[c:start])
        if _PARTIAL in head and c:
            continue
        full = _decode(tok, ids[c:])
        if full.startswith(head):
            return full[len(head):]
    return None


def _encode(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"] if text else []


def _last_word_end(text: str) -> int:
    """Where the last word followed by whitespace ends (0 if none): pre-tokenizers split there,
    so the target tokens up to it do not depend on what comes after."""
    for i in range(len(text) - 1, 0, -1):
        if text[i].isspace() and not text[i - 1].isspace():
            return i
    return 0


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _special_prefix(tok: PreTrainedTokenizerBase) -> list[int]:
    """The ids a tokenizer puts before any text (a BOS), found by encoding a sample both ways."""
    with_specials = tok("a")["input_ids"]
    plain = tok("a", add_special_tokens=False)["input_ids"]
    for i in range(len(with_specials) - len(plain) + 1):
        if with_specials[i : i + len(plain)] == plain:
            return list(with_specials[:i])
    return []


class CommittedText:
    """The text of the target's committed tokens, decoded incrementally (committed tokens never
    change). An incomplete character at the end is left out until later tokens complete it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tok = tokenizer
        self.text = ""  # text of ids[:done]
        self.done = 0

    def view(self, ids: list[int]) -> str:
        if len(ids) > self.done:
            new = decode_suffix(self.tok, ids, self.done) if self.done else _decode(self.tok, ids)
            if new is None:  # cannot split the decode at `done`: decode it all
                self.text, self.done, new = "", 0, _decode(self.tok, ids)
            if not new.endswith(_PARTIAL):
                self.text += new
                self.done = len(ids)
            else:
                return self.text + new.rstrip(_PARTIAL)
        return self.text


class CrossTokenizerDrafter(SessionDrafter):
    """A small language model with its own tokenizer: drafts text, proposes target tokens."""

    def __init__(self, model: PreTrainedModel, target_tokenizer: PreTrainedTokenizerBase,
                 draft_tokenizer: PreTrainedTokenizerBase, max_draft_steps: int | None = None):
        self.model = model
        self.target_tokenizer = target_tokenizer
        self.draft_tokenizer = draft_tokenizer
        self.max_draft_steps = max_draft_steps
        self.draft_eos = eos_ids(model)
        if draft_tokenizer.eos_token_id is not None:
            self.draft_eos.add(int(draft_tokenizer.eos_token_id))
        self.target_eos = target_tokenizer.eos_token_id
        self.limit = context_limit(model)
        # An encoder-decoder draft's encoder reads at most this many of its tokens of a prompt.
        self.encoder_limit = context_limit(model, encoder=True) if model.config.is_encoder_decoder else None
        self.bos = [] if model.config.is_encoder_decoder else _special_prefix(draft_tokenizer)

    def step_timer(self, prompt_ids: list[int], seq: list[int], burst: int) -> StepTimer:
        session = self.start(prompt_ids, seq, lambda cur, logits: (0, None))
        session.propose(seq, 1)  # the draft's prefill, untimed

        def timer() -> float:
            # Per target token proposed: draft steps and the re-encoding together.
            t0 = time.perf_counter()
            n = len(session.propose(seq, burst).tokens)
            return (time.perf_counter() - t0) / max(n, 1)

        return timer

    def start(self, prompt_ids: list[int], decoder_ids: list[int], pick: Picker) -> CrossTokenizerSession:
        if self.model.config.is_encoder_decoder:
            # The draft encodes the prompt's text in its own tokens, cut (end token kept) to what its encoder takes, no
            # text (special tokens only) as its end token: a worse guess, never another output. Its decoder starts anew.
            text, limit = _decode(self.target_tokenizer, prompt_ids), self.encoder_limit
            draft_prompt = self.draft_tokenizer(text, truncation=limit is not None, max_length=limit)["input_ids"]
            draft_prompt = draft_prompt or [self.draft_tokenizer.eos_token_id or 0]
            head = initial_decoder_ids(self.model, draft_prompt)
        else:
            draft_prompt, head = [], list(self.bos)
        return CrossTokenizerSession(self, one_row(self.model, draft_prompt), head)


class CrossTokenizerSession(DraftSession):
    """One item: the draft's cache, the draft ids of the committed text, and the committed text."""

    def __init__(self, drafter: CrossTokenizerDrafter, decoder: BatchKV, head: list[int]):
        self.d = drafter
        self.decoder = decoder
        self.head = head  # fixed draft ids before the text (BOS, or the decoder start token)
        self.committed = CommittedText(drafter.target_tokenizer)
        self.ids: list[int] = []  # draft ids of `self.text`, the committed text at the last sync
        self.text = ""
        self.fed_ids: list[int] = []  # the sequence whose first decoder.length(0) ids the cache holds
        self.full_syncs = 0  # rounds whose window did not line up (re-encoded everything)

    def _reencode(self, view: str) -> list[int]:
        """Draft ids of `view`: the shared text's ids up to a draft-token boundary a few tokens back, then the rest of
        `view` encoded alone. The window's ids must decode (in context) to exactly its text: a tokenizer adding a
        prefix space to every encode (SentencePiece) fails that mid-word, so earlier boundaries are tried, then all."""
        tok, ids = self.d.draft_tokenizer, self.ids
        for j in range(max(0, len(ids) - DRAFT_WINDOW), max(0, len(ids) - 3 * DRAFT_WINDOW), -1):
            suffix = decode_suffix(tok, ids, j)
            if suffix is None or suffix.startswith(_PARTIAL) or not self.text.endswith(suffix):
                continue
            pos = len(self.text) - len(suffix)
            if not view.startswith(self.text[:pos]):
                break
            new = ids[:j] + _encode(tok, view[pos:])
            if decode_suffix(tok, new, j) == view[pos:]:
                return new
        if ids:
            self.full_syncs += 1
        return _encode(tok, view)

    def sync(self, seq: list[int]) -> list[int]:
        """Draft ids of the committed text (head included); the cache rolled back to the longest
        prefix it shares with them (never all of them: the last one is fed to get logits)."""
        view = self.committed.view(seq)
        self.ids = self._reencode(view)
        self.text = view
        full = self.head + self.ids
        keep = min(_common_prefix(self.fed_ids[: self.decoder.length(0)], full), len(full) - 1)
        self.decoder.rollback(0, max(keep, 0))
        return full

    def propose(self, seq: list[int], k: int) -> Draft:
        cur = self.sync(seq)
        if not cur or k < 1:
            return Draft([], None)
        base = len(cur)
        tail = self._target_tail(seq)
        max_steps = self.d.max_draft_steps or 2 * k + 4
        props: list[int] = []
        text: str | None = ""
        for _ in range(max_steps):
            if self.d.limit is not None and len(cur) >= self.d.limit:
                break  # the draft's own context is full: propose what it has
            logits = feed_to(self.decoder, cur, 1)
            self.fed_ids = cur
            self.steps += 1
            token = int(logits[0].argmax())
            if token in self.d.draft_eos:
                props = self._to_target(tail, text) if base < len(cur) and text is not None else []
                if self.d.target_eos is not None:
                    props = props + [int(self.d.target_eos)]
                break
            cur.append(token)
            text = decode_suffix(self.d.draft_tokenizer, cur, base)
            if text is None:  # inside a character whose bytes do not decode yet
                continue
            text = text.rstrip(_PARTIAL)
            stable = _last_word_end(text)
            # The text may end inside a target token, and a word's first pieces may split otherwise once complete:
            # propose up to the last word's end, or, without one, all but the last target token.
            props = self._to_target(tail, text[:stable]) if stable else self._to_target(tail, text)[:-1]
            if len(props) >= k:
                break
        return Draft(props[:k], None)

    def _target_tail(self, seq: list[int]) -> tuple[str, list[int], list[int]]:
        """The committed text of the last TARGET_TAIL target tokens (from a whole character), its target encoding, and
        the committed tokens after it: a character's first bytes, which the next tokens must complete."""
        tok = self.d.target_tokenizer
        for pending in range(4):  # a UTF-8 character has at most 4 bytes
            end = len(seq) - pending
            text = self._clean_suffix(seq[:end])
            if text is not None and not text.endswith(_PARTIAL):
                return text, _encode(tok, text), seq[end:]
        return "", [], []

    def _clean_suffix(self, ids: list[int]) -> str | None:
        tok = self.d.target_tokenizer
        for s in range(max(0, len(ids) - TARGET_TAIL), max(-1, len(ids) - 2 * TARGET_TAIL), -1):
            text = decode_suffix(tok, ids, s) if s else _decode(tok, ids)
            if text is not None and not text.startswith(_PARTIAL):
                return text
        return None

    def _to_target(self, tail: tuple[str, list[int], list[int]], text: str) -> list[int]:
        """The target tokens `text` adds after the committed tail."""
        tail_text, tail_ids, pending = tail
        if not text:
            return []
        ids = _encode(self.d.target_tokenizer, tail_text + text)
        if ids[: len(tail_ids)] == tail_ids:
            ids = ids[len(tail_ids):]
        else:
            # The committed end falls inside a re-encoded token: take the draft text's own encoding, if it decodes
            # to the text after the committed tokens (not so where the tokenizer adds a prefix space).
            ids = _encode(self.d.target_tokenizer, text)
            if decode_suffix(self.d.target_tokenizer, tail_ids + ids, len(tail_ids)) != text:
                return []
        if pending:  # the committed tokens already hold the first bytes of the text's first character
            ids = ids[len(pending):] if ids[: len(pending)] == pending else []
        return ids
