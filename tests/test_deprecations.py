"""The suite's warning filters (pyproject.toml): a deprecated transformers call fails a test."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM


def test_a_deprecated_transformers_keyword_is_an_error():
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        model(input_ids=ids, cache=DynamicCache())  # the current keyword: no warning
        with pytest.raises(FutureWarning, match="past_key_values"):
            model(input_ids=ids, past_key_values=DynamicCache())
