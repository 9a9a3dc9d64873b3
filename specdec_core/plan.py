"""A model's plan: whether its passes run over static caches (one item at a time or in batch
slots) with CUDA graphs and compiled, whether it batches at all, and why not.

The one place that reads `--cuda_graphs` and `--torch_compile`: from the config (`config_support`, `unbatchable`,
which preflight and the fit check ask before any load), the loaded model (`graph_support`) and the self-checks'
passes (`takes_static`, `padded_width`). The engines ask it for their caches (`slot_kv_for`);
the caches and the self-checks import nothing from here, so no import goes in a circle
(docs/how-it-works.md, "On a GPU: static caches and CUDA graphs")."""

from __future__ import annotations

import inspect
import logging
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from specdec_core.decoder import counts_positions_from_ids, decoder_position_modules, other_layer_kinds, position_table
from specdec_core.pass_settings import DEFAULT, PassSettings
from specdec_core.self_check import encoder_mask_disagreement, narrowest_width, rows_disagreement, static_disagreement
from specdec_core.slot_kv import SlotKV

log = logging.getLogger(__name__)

GRAPH_MODES = ("auto", "on", "off")  # --cuda_graphs and --torch_compile


def config_support(config) -> str | None:
    """None when a model of this config can decode over static caches (one item at a time or in slots), as far as
    its config tells (the preflight's check), else why not."""
    if why := unbatchable(config):  # (its other layer kinds, as for padded batches)
        return why
    text = config.get_text_config(decoder=True)
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if isinstance(rope, dict) and "dynamic" in (rope.get("rope_type"), rope.get("type")):
        return "uses dynamic-NTK RoPE (it recomputes its frequencies from a length read on the host)"
    if getattr(text, "alibi", False) is True or getattr(getattr(text, "attn_config", None), "alibi", False) is True:
        return "builds ALiBi biases from a 2D attention mask (static caches pass a 4D one)"
    return None


def graph_support(model: PreTrainedModel, batched: bool = False) -> str | None:
    """None when this loaded model can decode over static caches (`config_support`), else why not."""
    if getattr(model, "hf_device_map", None):
        return "is split over several devices (a graph replays on one)"
    why = config_support(model.config)
    if why:
        return why
    if model.config._attn_implementation not in ("sdpa", "eager"):
        return f"uses {model.config._attn_implementation} attention (needs sdpa or eager, which take a 4D mask)"
    if not model.config.is_encoder_decoder and "position_ids" not in inspect.signature(model.forward).parameters:
        return "takes no position_ids"
    if model.config.is_encoder_decoder and batched:
        # Each row's positions are looked up in its decoder's position tables (`decoder.lookup_by_row`).
        for module in decoder_position_modules(model)[0]:
            if not counts_positions_from_ids(module) and not position_table(module):
                return (f"has a decoder position embedding ({type(module).__name__}) that computes one set of "
                        "positions for all rows")
    return None


def wants_static(model: PreTrainedModel, mode: str, batched: bool = False) -> bool:
    """`--cuda_graphs` per model: "auto" takes static caches (graphed) on CUDA for models they support; "on" insists
    (eagerly on a CPU, as the tests check them) and fails for a model they cannot take; "off" never."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"cuda_graphs must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    if mode == "off":
        return False
    why = graph_support(model, batched)
    if mode == "auto" and (why or model.device.type != "cuda"):
        if why and model.device.type == "cuda":
            log.info("no CUDA graphs for %s%s: it %s", type(model).__name__, " batches" if batched else "", why)
        return False
    if why:
        raise ValueError(f"cuda_graphs on: {type(model).__name__} {why}")
    return True


def takes_static(model: PreTrainedModel, mode: str, batched: bool = False, pad_id: int = 0) -> int | None:
    """`wants_static`, then the self-check over static caches (`batched`: in slots): the narrowest exact pass
    (`SlotKV.min_width`: 1, or 2 for LED's), or None. A model refused at both runs eagerly with "auto" (logged) and
    stops the job with "on"."""
    if not wants_static(model, mode, batched):
        return None

    def why(width: int) -> str | None:
        return rows_disagreement(model, pad_id, min_width=width) if batched else static_disagreement(model, width)

    width = narrowest_width(why)
    if width:
        return width
    if mode == "on":
        raise ValueError(f"cuda_graphs on: {type(model).__name__} {why(1)}")
    log.warning("no static caches for %s: it %s; %s eagerly", type(model).__name__ + (" batches" if batched else ""),
                why(1), "they run" if batched else "it runs")
    return None


def slot_kv_for(model: PreTrainedModel, mode: str = "auto", slots: int = 1, pad_id: int = 0, compile: bool = False,
                settings: PassSettings = DEFAULT) -> SlotKV | None:
    """The engines' static cache (batch 1: one slot) for `--cuda_graphs` (`takes_static`) and `--torch_compile`, or
    None."""
    batched = slots > 1
    width = takes_static(model, mode, batched=batched, pad_id=pad_id)
    name = type(model).__name__
    if not width:
        if compile:
            log.info("--torch_compile: %s uncompiled (%s passes run over no static cache)",
                     *((f"{name} batches run", "their") if batched else (f"{name} runs", "its")))
        return None
    if model.config.is_encoder_decoder and settings.graph_encoder and (why := encoder_mask_disagreement(model)):
        log.info("%s's prompts are encoded eagerly (no CUDA graphs of its encoder): it %s", name, why)
        settings = replace(settings, graph_encoder=False)
    kv = SlotKV(model, slots, pad_id, strict=mode == "on", compile=compile, min_width=width, settings=settings)
    log.info("%s %s%s%s", name, f"batches decode in {slots} fixed slots" if batched else "decodes over a static cache",
             " with CUDA graphs (each pass width captured once, on first use; the log says what it costs)"
             if kv.passes.on else ", eagerly (no CUDA device)",
             ", its passes compiled by torch.compile" if compile else "")
    return kv


def compiles(torch_compile: str, cuda_graphs: str, device: torch.device) -> bool:
    """`--torch_compile`: on; or auto, wherever passes are CUDA graphs over static caches (docs/performance.md)."""
    if torch_compile == "auto":
        return cuda_graphs != "off" and device.type == "cuda"
    return torch_compile == "on"


def unbatchable(config) -> str | None:
    """Why a model cannot decode in padded batches, or None: they need full or sliding-window attention over a key/value
    cache; other layer kinds (chunked, linear, state-space) keep state rows cannot roll back or share."""
    other = other_layer_kinds(config)
    return f"has {', '.join(other)} layers" if other else None


def batch_refusal(model: PreTrainedModel, pad_id: int = 0) -> str | None:
    """Why a model cannot decode in padded batches, or None: its layers (`unbatchable`), or its self-check
    (`self_check.rows_disagreement`) at every `padded_width`."""
    if why := unbatchable(model.config):
        return why
    return None if padded_width(model, pad_id) else rows_disagreement(model, pad_id, slots=False)


def padded_width(model: PreTrainedModel, pad_id: int = 0) -> int | None:
    """The narrowest pass over holes giving a padded batch's rows their own logits (`BatchKV.min_width`): 1, or 2
    for a decoder that builds no mask for a one-token pass (LED's); None if neither does."""
    return narrowest_width(lambda w: rows_disagreement(model, pad_id, slots=False, min_width=w))
