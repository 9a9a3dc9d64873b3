"""Stop strings: where in a stream of committed tokens the decoded text first holds one.

The engine has no tokenizer; it asks a per-item finish check after every round (see
`SpeculativeGenerator.generate`). `StopStrings` is that check: fed each round's committed tokens once, it returns
the index of the token that completes a stop string, like Hugging Face's `StopStringCriteria` but on decoded text,
decoding only a tail window per token (docs/instruct-models.md, "Stop strings").
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

_MARGIN = 4  # tokens before the longest possible match: up to 3 bytes of a split character + a leading space


def check_stop_strings(stops: Sequence[str]) -> tuple[str, ...]:
    """The stop strings as a tuple; ValueError for an empty one (it would stop at once) or one holding U+FFFD,
    which a tail window that splits a character decodes to, so it would match where the text does not hold it."""
    for s in (stops := tuple(stops)):
        if not isinstance(s, str) or not s or "\ufffd" in s:
            raise ValueError(f"--stop {s!r}: a stop string must be non-empty text without U+FFFD (undecodable bytes)")
    return stops


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` up to (not including) the earliest occurrence of any stop string, and whether one was found."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


class StopStrings:
    """One item's stop-string check: `__call__(new_tokens)` -> index of the completing token, or None.
    Stateful: one per item. Text is decoded as the output's `generation` is, `skip_special_tokens=True`."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.stops = check_stop_strings(stops)
        self.special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}  # (what decode skips)
        self.window = max(len(s.encode("utf-8")) for s in self.stops) + _MARGIN if self.stops else 0
        self.tokens: list[int] = []

    def __call__(self, new_tokens: Sequence[int]) -> int | None:
        for i, tok in enumerate(new_tokens):
            self.tokens.append(int(tok))
            if tok not in self.special and self._completed():
                return i
        return None

    def _completed(self) -> bool:
        """Whether the last token completes a stop (none did before); a window's match confirmed on the whole text."""
        start, counted = len(self.tokens), 0
        while start > 0 and counted < self.window:
            start -= 1
            counted += self.tokens[start] not in self.special
        texts = (self.tokenizer.decode(self.tokens[i:], skip_special_tokens=True) for i in sorted({start, 0})[::-1])
        return all(any(s in text for s in self.stops) for text in texts)
