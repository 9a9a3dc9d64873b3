"""Tiny random models of the families users pair, each with its family's special-token layout
and generation config (decoder start, forced BOS/EOS, pad = EOS, several EOS ids, bad words),
built offline (no hub). Sliding-window families get a window shorter than a test's generations.
"""

from __future__ import annotations

import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    M2M100Config,
    M2M100ForConditionalGeneration,
    MarianConfig,
    MarianMTModel,
    MBartConfig,
    MBartForConditionalGeneration,
    MistralConfig,
    MistralForCausalLM,
    MT5Config,
    MT5ForConditionalGeneration,
    PegasusConfig,
    PegasusForConditionalGeneration,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
    Starcoder2Config,
    Starcoder2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    UMT5Config,
    UMT5ForConditionalGeneration,
)

V = 128  # vocabulary
WINDOW = 6  # sliding window of the sliding-window families (tokens)
SEQ2SEQ_FAMILIES = ("t5", "mt5", "umt5", "bart", "pegasus", "marian", "m2m100", "mbart")
WINDOW_FAMILIES = ("mistral", "phi3", "gemma2", "gemma3", "gemma3n", "gemma4", "gpt_oss", "cohere2", "starcoder2",
                   "exaone4", "phimoe")
# Decoder-only families with full attention, each with its own position scheme (RoPE variants,
# learned positions with an offset, ALiBi from the mask, layers without positions), MLP and norm
# layout, three mixtures of experts, a state-space model and a recurrent one (which the engines
# refuse).
DECODER_FAMILIES = ("qwen2", "qwen3", "gemma", "opt", "gpt_neox", "gptj", "gpt_bigcode", "phi", "stablelm",
                    "olmo2", "cohere", "granite", "falcon", "falcon-alibi", "bloom", "mixtral", "qwen2_moe",
                    "qwen3_moe", "smollm3", "mamba", "recurrent_gemma",
                    # multi-head latent attention (keys and values of other widths) with experts; more
                    # layouts and mixtures; ALiBi; chunked attention; GPT-Neo's local layers
                    "deepseek_v3", "glm4", "ernie4_5_moe", "olmoe", "granitemoe", "mpt", "llama4_text", "gpt_neo")


def _seq2seq(family: str):
    """(model class, config, generation-config fields) in the family's layout."""
    small = dict(vocab_size=V, d_model=32)
    t5 = dict(d_ff=64, d_kv=8, num_layers=1, num_decoder_layers=2, num_heads=4, pad_token_id=0, eos_token_id=1,
              decoder_start_token_id=0, relative_attention_num_buckets=8, relative_attention_max_distance=16,
              initializer_factor=3.0, tie_word_embeddings=False)
    bartish = dict(encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                   encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128, init_std=0.3)
    if family == "t5":
        return T5ForConditionalGeneration, T5Config(**small, **t5), {}
    if family == "mt5":
        return MT5ForConditionalGeneration, MT5Config(**small, **t5), {}
    if family == "umt5":  # a relative bias in every layer
        return UMT5ForConditionalGeneration, UMT5Config(**small, **t5), {}
    if family == "bart":  # <s>=0 <pad>=1 </s>=2; decoding starts at </s>, forced <s> then </s> at the end
        cfg = BartConfig(**small, **bartish, bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
        return BartForConditionalGeneration, cfg, dict(forced_bos_token_id=0, forced_eos_token_id=2)
    if family == "pegasus":  # <pad>=0 </s>=1, start = pad, sinusoidal positions
        cfg = PegasusConfig(**small, **bartish, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                            scale_embedding=True)
        return PegasusForConditionalGeneration, cfg, dict(forced_eos_token_id=1)
    if family == "marian":  # </s>=0, <pad> = the last id = decoder start, and pad is a bad word
        pad = V - 1
        cfg = MarianConfig(**small, **bartish, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                           forced_eos_token_id=0, scale_embedding=True)
        return MarianMTModel, cfg, dict(forced_eos_token_id=0, bad_words_ids=[[pad]])
    if family == "m2m100":  # NLLB-style: start </s>=2, forced target-language token first
        cfg = M2M100Config(**small, **bartish, bos_token_id=0, pad_token_id=1, eos_token_id=2,
                           decoder_start_token_id=2, scale_embedding=True)
        return M2M100ForConditionalGeneration, cfg, dict(forced_bos_token_id=V - 3, forced_eos_token_id=2)
    if family == "mbart":  # mBART-50: start </s>=2, forced language code, then </s> at the end
        cfg = MBartConfig(**small, **bartish, bos_token_id=0, pad_token_id=1, eos_token_id=2,
                          decoder_start_token_id=2, scale_embedding=True)
        return MBartForConditionalGeneration, cfg, dict(forced_bos_token_id=V - 5, forced_eos_token_id=2)
    raise ValueError(family)


def _causal(family: str, window: int | None):
    small = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3, tie_word_embeddings=False)
    if family == "mistral":  # <s>=1 </s>=2, no pad
        cfg = MistralConfig(**small, sliding_window=window, bos_token_id=1, eos_token_id=2, pad_token_id=None)
        return MistralForCausalLM, cfg, {}
    if family == "phi3":  # pad = <|endoftext|> = EOS, and the chat end tokens are EOS too
        cfg = Phi3Config(**small, sliding_window=window, bos_token_id=1, eos_token_id=V - 4, pad_token_id=V - 4)
        return Phi3ForCausalLM, cfg, dict(eos_token_id=[V - 4, V - 3, V - 2])
    if family == "gemma2":  # <pad>=0 <eos>=1 <bos>=2, <end_of_turn> is an EOS too; local/global layers
        cfg = Gemma2Config(**small, head_dim=8, sliding_window=window or 4096, pad_token_id=0, eos_token_id=1,
                           bos_token_id=2, layer_types=["sliding_attention", "full_attention"])
        return Gemma2ForCausalLM, cfg, dict(eos_token_id=[1, V - 2])
    if family == "gemma3":
        cfg = Gemma3TextConfig(**small, head_dim=8, sliding_window=window or 4096, pad_token_id=0, eos_token_id=1,
                               bos_token_id=2, layer_types=["sliding_attention", "full_attention"])
        return Gemma3ForCausalLM, cfg, dict(eos_token_id=[1, V - 3])
    if family in ("gemma3n", "gemma4"):  # the last two of four layers reuse earlier layers' keys/values
        import transformers

        name = {"gemma3n": "Gemma3n", "gemma4": "Gemma4"}[family]
        own = dict(altup_active_idx=0, altup_num_inputs=2, laurel_rank=4, intermediate_size=[64] * 4,
                   activation_sparsity_pattern=[0.0] * 4) if family == "gemma3n" else {}
        cfg = getattr(transformers, f"{name}TextConfig")(
            **{**small, **own, "num_hidden_layers": 4}, head_dim=8, sliding_window=window or 4096,
            layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2,
            hidden_size_per_layer_input=8, vocab_size_per_layer_input=V, pad_token_id=0, eos_token_id=1,
            bos_token_id=2)
        return getattr(transformers, f"{name}ForCausalLM"), cfg, dict(eos_token_id=[1, V - 2])
    if family == "gpt_oss":  # attention sinks, sliding and full layers, a mixture of experts; several EOS
        from transformers import GptOssConfig, GptOssForCausalLM

        cfg = GptOssConfig(**small, head_dim=8, sliding_window=window or 4096, num_local_experts=4,
                           num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"],
                           pad_token_id=0, eos_token_id=1, bos_token_id=2)
        return GptOssForCausalLM, cfg, dict(eos_token_id=[1, V - 2])
    if family == "cohere2":  # sliding layers with RoPE, full ones without positions (NoPE)
        from transformers import Cohere2Config, Cohere2ForCausalLM

        cfg = Cohere2Config(**small, sliding_window=window or 4096, layer_types=["sliding_attention", "full_attention"],
                            pad_token_id=0, bos_token_id=5, eos_token_id=V - 1)
        return Cohere2ForCausalLM, cfg, {}
    if family == "starcoder2":  # <|endoftext|>=0 is BOS and EOS
        cfg = Starcoder2Config(**small, sliding_window=window, bos_token_id=0, eos_token_id=0, pad_token_id=None)
        return Starcoder2ForCausalLM, cfg, {}
    if family in ("exaone4", "phimoe"):  # sliding and full layers; a mixture of experts with a window
        own = (dict(layer_types=["sliding_attention", "full_attention"]) if family == "exaone4"
               else dict(num_local_experts=4, num_experts_per_tok=2))
        return _by_type(family, small, sliding_window=window or 4096, **own)
    if family in DECODER_FAMILIES or family in _MORE_DECODERS:
        return _full_attention(family, small)
    raise ValueError(family)


# More encoder-decoder layouts: long-document summarizers (LED, LongT5, PEGASUS-X, BigBird-
# Pegasus), FSMT (WMT19 translation), dialogue and code models, and two mixtures of experts.
MORE_SEQ2SEQ = ("led", "longt5", "pegasus_x", "bigbird_pegasus", "fsmt", "blenderbot", "blenderbot_small", "plbart",
                "mvp", "switch", "nllb_moe", "t5gemma", "seamless_m4t")


def _more_seq2seq(family: str):
    """(model class, config, generation-config fields) of a `MORE_SEQ2SEQ` family."""
    import transformers

    bartish = dict(vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                   pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    t5ish = dict(vocab_size=V, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4,
                 pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    own = {"led": ("LED", {**bartish, "max_encoder_position_embeddings": 128, "max_decoder_position_embeddings": 128,
                           "attention_window": [8]}),
           "longt5": ("LongT5", {**t5ish, "encoder_attention_type": "transient-global"}),
           "pegasus_x": ("PegasusX", {**bartish, "num_global_tokens": 4, "block_size": 8, "pad_token_id": 0,
                                      "eos_token_id": 1, "decoder_start_token_id": 0}),
           "bigbird_pegasus": ("BigBirdPegasus", {**bartish, "attention_type": "original_full"}),
           "fsmt": ("FSMT", {**{k: v for k, v in bartish.items() if k != "vocab_size"}, "src_vocab_size": V,
                             "tgt_vocab_size": V, "langs": ["en", "de"]}),
           "blenderbot": ("Blenderbot", bartish), "blenderbot_small": ("BlenderbotSmall", bartish),
           "plbart": ("PLBart", bartish), "mvp": ("Mvp", bartish),
           "nllb_moe": ("NllbMoe", {**bartish, "num_experts": 4, "expert_capacity": 64, "encoder_sparse_step": 1,
                                    "decoder_sparse_step": 1}),
           "switch": ("SwitchTransformers", {**t5ish, "num_experts": 2, "expert_capacity": 64,
                                                 "num_sparse_encoder_layers": 1, "num_sparse_decoder_layers": 1})}
    if family == "t5gemma":  # Gemma 2 layers, local and global, in encoder and decoder: every row passes the window
        module = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
                      layer_types=["sliding_attention", "full_attention"])
        config = transformers.T5GemmaConfig(encoder=transformers.T5GemmaModuleConfig(**module),
                                            decoder=transformers.T5GemmaModuleConfig(**module), vocab_size=V,
                                            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                                            tie_word_embeddings=False)
        return transformers.T5GemmaForConditionalGeneration, config, {}
    if family == "seamless_m4t":  # its text-to-text model: <pad>=0 <s>=2 </s>=3, start </s>, then the
        # target language's code (a forced BOS here)
        tokens = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=3)
        config = transformers.SeamlessM4TConfig(**{**bartish, **tokens, "t2u_vocab_size": V, "hidden_size": 32},
                                                speech_encoder_layers=1, speech_encoder_attention_heads=4,
                                                speech_encoder_intermediate_size=64, t2u_encoder_layers=1,
                                                t2u_decoder_layers=1, t2u_encoder_attention_heads=4,
                                                t2u_decoder_attention_heads=4, t2u_encoder_ffn_dim=64,
                                                t2u_decoder_ffn_dim=64)
        return transformers.SeamlessM4TForTextToText, config, dict(forced_bos_token_id=V - 4)
    if family in ("bert2bert", "roberta2roberta"):  # `EncoderDecoderModel`s: [PAD]=0 (RoBERTa's <pad>=1),
        # start [CLS] (1 here), EOS [SEP] (2); 128 usable positions (RoBERTa's count from its pad id + 1)
        roberta = family == "roberta2roberta"
        half = dict(vocab_size=V, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=130 if roberta else 128, pad_token_id=1 if roberta else 0)
        kind = transformers.RobertaConfig if roberta else transformers.BertConfig
        config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
            kind(**half, num_hidden_layers=1), kind(**half, num_hidden_layers=2, is_decoder=True,
                                                  add_cross_attention=True))
        config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 0 if roberta else 1, half[
            "pad_token_id"], 2
        return transformers.EncoderDecoderModel, config, dict(eos_token_id=2, pad_token_id=half["pad_token_id"])
    name, kwargs = own[family]
    config = getattr(transformers, f"{name}Config")(**kwargs)
    cls = getattr(transformers, f"{name}ForConditionalGeneration")
    return cls, config, {}


def _full_attention(family: str, small: dict):
    """(model class, config, generation-config fields) of a `DECODER_FAMILIES` family: pad 0, BOS 1, EOS 2."""
    import transformers

    names = {"qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma", "opt": "OPT", "gpt_neox": "GPTNeoX", "gptj": "GPTJ",
             "gpt_bigcode": "GPTBigCode", "phi": "Phi", "stablelm": "StableLm", "olmo2": "Olmo2",
             "cohere": "Cohere", "granite": "Granite", "falcon": "Falcon", "falcon-alibi": "Falcon", "bloom": "Bloom",
             "mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "smollm3": "SmolLM3",
             "mamba": "Mamba", "recurrent_gemma": "RecurrentGemma"}
    own = {"qwen3": dict(head_dim=8), "gemma": dict(head_dim=8), "opt": dict(ffn_dim=64, word_embed_proj_dim=32),
           "gptj": dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=256),
           "gpt_bigcode": dict(n_embd=32, n_layer=2, n_head=4, n_positions=256),
           "falcon": dict(new_decoder_architecture=True, num_kv_heads=2, alibi=False),
           "falcon-alibi": dict(alibi=True, multi_query=True), "bloom": dict(n_layer=2, n_head=4),
           "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
           "recurrent_gemma": dict(num_hidden_layers=3, lru_width=32, attention_window_size=WINDOW,
                                   block_types=["recurrent", "recurrent", "attention"]),
           "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32),
           "qwen3_moe": dict(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
           # every other layer without RoPE (NoPE): positions from the causal mask alone there
           "smollm3": dict(no_rope_layers=[1, 0])}
    if family not in names:
        return _by_type(family, small, **_MORE_DECODERS[family])
    config = getattr(transformers, f"{names[family]}Config")(**{**small, **own.get(family, {})}, pad_token_id=0,
                                                             bos_token_id=1, eos_token_id=2)
    return getattr(transformers, f"{names[family]}ForCausalLM"), config, {}


_MLA = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8,
            v_head_dim=12)
_MORE_DECODERS = {  # model type -> its own config fields (None: not the Llama-like `small` base)
    "deepseek_v3": dict(_MLA, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1),
    "glm4": dict(head_dim=8),
    "ernie4_5_moe": dict(head_dim=8, moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_layer_start_index=1),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=2.0, logits_scaling=4.0,
                       residual_multiplier=0.5, attention_multiplier=0.25),
    "mpt": dict(base=None, vocab_size=V, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=256),
    # chunks of 8 tokens, shorter than a test's rows
    "llama4_text": dict(head_dim=8, intermediate_size_mlp=64, num_local_experts=2, num_experts_per_tok=1,
                        attention_chunk_size=8, interleave_moe_layer_step=2, no_rope_layers=[1, 0]),
    # mixtures of experts whose routing reads values on the host (`nonzero`, `tolist`): exact
    # eagerly, no CUDA graph can capture their passes
    "dbrx": dict(base=None, vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=256,
                 attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0),
                 ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2)),
    "jetmoe": dict(base=None, vocab_size=V, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, kv_channels=8,
                   intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
                   tie_word_embeddings=False),
    # a local window of 8 tokens, which a test's rows pass (GPT-Neo-125M's is 256)
    "gpt_neo": dict(base=None, vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                    max_position_embeddings=256, attention_types=[[["global", "local"], 1]], window_size=8),
}


def _by_type(model_type: str, small: dict, base: bool | None = True, **own):
    """(model class, config, {}) of a model type from transformers' registry: the Llama-like `small`
    fields (unless `base` is None) and its own; pad 0, BOS 1, EOS 2."""
    from transformers import CONFIG_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING

    fields = {**(small if base is not None else {}), **own, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    config = CONFIG_MAPPING[model_type](**fields)
    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)], config, {}


def family_model(family: str, seed: int, window: int | None = WINDOW, **overrides) -> PreTrainedModel:
    """A random model of `family` (window: the sliding window; None or large = none reached)."""
    cls, cfg, gen = (_seq2seq(family) if family in SEQ2SEQ_FAMILIES else _more_seq2seq(family)
                     if family in MORE_SEQ2SEQ + ("bert2bert", "roberta2roberta") else _causal(family, window))
    for key, value in overrides.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    if family not in SEQ2SEQ_FAMILIES:  # peaked distributions: greedy ties are then vanishingly rare
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.3)
    for key, value in gen.items():
        setattr(model.generation_config, key, value)
    model.generation_config.decoder_start_token_id = getattr(cfg, "decoder_start_token_id", None)
    return model


def multimodal_gemma3(seed: int) -> PreTrainedModel:
    """Gemma 3 as its 4B and larger checkpoints load (`Gemma3ForConditionalGeneration`, a vision
    tower beside the text model): its window and layer types sit in its text config only."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    text = _causal("gemma3", WINDOW)[1]
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=16, patch_size=8)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=V - 1,
                       boi_token_index=V - 2, eoi_token_index=V - 3)
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "vision" not in name:
                p.normal_(0, 0.3)
    model.generation_config.eos_token_id = [1, V - 3]
    return model


def with_window(model: PreTrainedModel, window: int) -> PreTrainedModel:
    """The same weights with another sliding window (a window no row reaches: none)."""
    cls = type(model)
    cfg = model.config.__class__.from_dict(model.config.to_dict())
    cfg.sliding_window = window
    other = cls(cfg).eval()
    other.load_state_dict(model.state_dict())
    other.generation_config = model.generation_config
    return other


def save_family(family: str, path, seed: int = 1, **overrides):
    """A `family_model` (config `overrides`) over the tests' byte-level tokenizer (its
    vocabulary, its EOS as the decoder start), saved with it as a user's model directory;
    returns the path."""
    from tests.tiny_models import build_tokenizer

    tok = build_tokenizer()
    eos = tok.eos_token_id
    vocab = {"src_vocab_size": len(tok), "tgt_vocab_size": len(tok)} if family == "fsmt" else {"vocab_size": len(tok)}
    model = family_model(family, seed=seed, window=None, **vocab, eos_token_id=eos, decoder_start_token_id=eos,
                         **overrides)
    model.generation_config.decoder_start_token_id = model.generation_config.eos_token_id = eos
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
