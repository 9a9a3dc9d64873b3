"""One model split over several devices, without `accelerate`.

transformers 5.24 needs `accelerate` for any `device_map` (which the lock does not carry), so
the split is done here, the way accelerate's hooks do it: the model's repeated blocks (its
decoder layers, `_no_split_modules`) are spread over the devices in forward order, balanced by
bytes, and every placed module gets a pre-hook that moves its tensor arguments to its own device.
Everything else (embeddings, final norm, output head, rotary tables) stays on the first device, so
the input ids go in and the logits come out on `model.device`: the engine sees one device, and
each layer's KV cache is created on that layer's device. The arithmetic is unchanged, so the
output is exactly the unsplit model's.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

HOOK_ATTR = "_specdec_device_hook"


def block_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """(name, list) of the model's repeated blocks, in forward order (an encoder's before its
    decoder's): ModuleLists of the classes `_no_split_modules` names, else of one class."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        kinds = {type(m).__name__ for m in module}
        if (names and kinds <= names) or (not names and len(kinds) == 1):
            found.append((name, module))
    return found


def _own_bytes(module: nn.Module, seen: set[int]) -> int:
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def build_device_map(model: nn.Module, devices: list[str], first_extra: int = 0) -> dict[str, str]:
    """Module name -> device. The blocks go over `devices` in order, contiguous, so that each
    device holds about the same bytes; the rest of the model (and `first_extra` bytes placed
    beside it, e.g. the draft) on the first device. Keys are the blocks and the modules beside
    them on the way from the root, as in accelerate's maps."""
    lists = block_lists(model)
    if not lists:
        raise ValueError(f"{type(model).__name__}: no repeated layers found to split over {', '.join(devices)}")
    list_names = {n for n, _ in lists}
    blocks = [(f"{n}.{i}", b) for n, bl in lists for i, b in enumerate(bl)]
    seen: set[int] = set()
    sizes = [_own_bytes(b, seen) for _, b in blocks]
    rest = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) - sum(sizes)
    share = (rest + first_extra + sum(sizes)) / len(devices)
    out: dict[str, str] = {}
    d, load = 0, rest + first_extra
    for (name, _), size in zip(blocks, sizes, strict=True):
        if load > 0 and load + size / 2 > share * (d + 1) and d < len(devices) - 1:
            d += 1
        out[name] = devices[d]
        load += size
    # The other modules on the path to the blocks: whole, on the first device.
    paths = {n.rsplit(".", 1)[0] if "." in n else "" for n in list_names}
    ancestors = {""} | {".".join(p.split(".")[:i]) for p in paths if p for i in range(1, len(p.split(".")) + 1)}
    for prefix in sorted(ancestors):
        parent = model.get_submodule(prefix) if prefix else model
        for child, _ in parent.named_children():
            full = f"{prefix}.{child}" if prefix else child
            if full not in ancestors and full not in list_names:
                out[full] = devices[0]
    return dict(sorted(out.items(), key=lambda kv: [int(p) if p.isdigit() else p for p in kv[0].split(".")]))


def _moved(value: object, device: torch.device) -> object:
    """Tensors (also in tuples, lists and dicts) on `device`; anything else, caches included, as is.
    A copy to the CPU waits for its data: a non-blocking one from a GPU returns before it lands."""
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device, non_blocking=device.type != "cpu")
    if isinstance(value, tuple | list):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    return value


def _has_state(module: nn.Module) -> bool:
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def dispatch(model: nn.Module, device_map: dict[str, str]) -> nn.Module:
    """Move each mapped module to its device and make it take its inputs there (a forward
    pre-hook). Tied weights stay tied: they live on the first device with the embeddings."""
    for name, device in device_map.items():
        module = model.get_submodule(name)
        module.to(device)
        if not _has_state(module):
            continue  # no weights (dropout, say): computes wherever its input is
        target = torch.device(device)

        def hook(_module, args, kwargs, target=target):
            return _moved(args, target), _moved(kwargs, target)

        setattr(module, HOOK_ATTR, module.register_forward_pre_hook(hook, with_kwargs=True))
    return model


def load_split(model: nn.Module, devices: list[str], first_extra: int = 0) -> dict[str, str]:
    """Split a model (loaded on the CPU) over `devices`; returns the map it used."""
    device_map = build_device_map(model, devices, first_extra)
    dispatch(model, device_map)
    return device_map


def devices_of(model: nn.Module) -> Iterator[torch.device]:
    """Every distinct device holding a parameter of the model, in order of first appearance."""
    seen: list[torch.device] = []
    for p in model.parameters():
        if p.device not in seen:
            seen.append(p.device)
            yield p.device
