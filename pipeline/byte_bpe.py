"""A GPT-2-style byte-level BPE tokenizer trained on given texts, for the pairs the project
builds itself (bench pairs, test models): no hub, and every byte encodable."""

from __future__ import annotations

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def train_byte_level_bpe(texts: list[str], vocab_size: int, model_max_length: int = 1024):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=model_max_length)
