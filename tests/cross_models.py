"""Pairs whose tokenizers differ, built offline: two byte-level BPE tokenizers of different
sizes, a SentencePiece-style one (Metaspace, byte fallback), and an "oracle" draft that knows
the text the target will write, so that cross-tokenizer proposals are often accepted."""

from __future__ import annotations

import json

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from pipeline.byte_bpe import SPECIALS
from tests.tiny_models import CORPUS, build_tokenizer, make_model


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=512)


def byte_level(vocab_size: int) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE tokenizer (tests/tiny_models.py's, at another size)."""
    return build_tokenizer(vocab_size)


def sentencepiece_style(vocab_size: int = 330) -> PreTrainedTokenizerFast:
    """A Llama-2-style tokenizer: Metaspace pre-tokenizer ("▁" for spaces, prepended to the
    first word), BPE over characters with byte-fallback tokens <0x00>..<0xFF> for anything
    else (here: most non-ASCII), decoded through ByteFallback."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    ascii_chars = [chr(c) for c in range(32, 127) if chr(c) != " "] + ["▁", "\n", "\t"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=ascii_chars,
                                  limit_alphabet=len(ascii_chars), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
    out = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    out.add_special_tokens(SPECIALS)
    out.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    out.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return _wrap(out)


class OracleLM(LlamaForCausalLM):
    """A real tiny Llama (so its KV cache is real) whose logits are overwritten to continue a
    known reference text in its own tokenizer's canonical tokens. As a target, its greedy
    output is that text; as a draft, it agrees with such a target whatever the two tokenizers.
    `wrong_every` makes every n-th call propose a wrong token, to exercise rejections."""

    def attach(self, tok: PreTrainedTokenizerFast, reference: str, wrong_every: int = 0) -> OracleLM:
        self.tok, self.reference, self.wrong_every = tok, reference, wrong_every
        self.seen: list[int] = []
        self.calls = 0
        self.fed = 0  # tokens fed through forward (a cache that keeps up feeds few)
        return self

    def next_token(self, prefix: list[int]) -> int:
        """The canonical continuation of the reference after `prefix`: the reference's own
        encoding when `prefix` is a prefix of it, else the encoding of the rest of the text
        (`prefix` may end inside a character: then the continuation finishes its bytes)."""
        canonical = self.tok(self.reference)["input_ids"] + [self.tok.eos_token_id]
        if canonical[: len(prefix)] == prefix and len(prefix) < len(canonical):
            return canonical[len(prefix)]
        for pending in range(0, 4):
            text = self.tok.decode(prefix[: len(prefix) - pending], skip_special_tokens=True)
            if not text.endswith("\ufffd"):
                break
        if not self.reference.startswith(text):
            return self.tok.unk_token_id
        rest = self.reference[len(text):]
        if not rest:
            return self.tok.eos_token_id
        plan = self.tok(rest[:40], add_special_tokens=False)["input_ids"]
        done = prefix[len(prefix) - pending :] if pending else []
        if plan[: len(done)] != done or len(plan) <= len(done):
            return self.tok.unk_token_id
        return plan[len(done)]

    def forward(self, input_ids=None, cache=None, logits_to_keep=0, **kwargs):
        past = cache.get_seq_length() if cache is not None else 0
        out = super().forward(input_ids=input_ids, cache=cache, logits_to_keep=logits_to_keep,
                              **kwargs)
        self.seen = self.seen[:past] + input_ids[0].tolist()
        self.fed += input_ids.shape[1]
        n = out.logits.shape[1]
        logits = torch.full_like(out.logits, -30.0)
        for i in range(n):
            self.calls += 1
            token = self.next_token(self.seen[: len(self.seen) - n + i + 1])
            if self.wrong_every and self.calls % self.wrong_every == 0:
                token = (token + 11) % self.config.vocab_size
            logits[0, i, token] = 0.0
        out.logits = logits
        return out


def oracle_lm(tok: PreTrainedTokenizerFast, reference: str, wrong_every: int = 0, seed: int = 5) -> OracleLM:
    base = make_model("llama", tok, seed=seed, layers=1, hidden=32)
    model = OracleLM(LlamaConfig(**base.config.to_dict())).eval()
    model.load_state_dict(base.state_dict())
    return model.attach(tok, reference, wrong_every)
