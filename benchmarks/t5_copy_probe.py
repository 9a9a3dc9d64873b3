"""Can the demo's target architecture learn to copy from its input, and at which learning rate?

Issue 10's target kept writing generic summaries instead of the names it was given. This probe
strips the task to its core: the input is a marker, a "name" of 2-4 random tokens, a second
marker and 20-50 random tokens; the label is the name. A model that copies gets it right on names
it never saw; a model that memorises does not. The demo target's own T5 shape and vocabulary size
(`demo_models.make_model` on `FULL`: 4 + 4 layers, d_model 128, vocab 2048), AdamW, warm-up and
cosine decay, batches of 32, one thread (so a run is deterministic on one machine).

    python benchmarks/t5_copy_probe.py --data fresh --lr 3e-4 --steps 3000
    python benchmarks/t5_copy_probe.py --data fresh --lr 3e-4 --steps 10000 --log_every 500  # copies from ~3500
    python benchmarks/t5_copy_probe.py --data fixed --lr 1e-3 --steps 3000   # 5000 examples, reused

`fresh` draws new examples every step (only copying lowers the loss); `fixed` reuses 5000
(memorising does too). Prints the training loss, then on new names: exact copies of 50, and on
100 more the first token right, tokens right by position, and output tokens that occur in the input.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import torch

from pipeline import demo_models

V = demo_models.FULL.vocab_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", choices=("fresh", "fixed"), default="fresh")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--log_every", type=int, default=250)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)

    def example() -> tuple[list[int], list[int]]:
        name = [rng.randrange(20, V) for _ in range(rng.randint(2, 4))]
        noise = [rng.randrange(20, V) for _ in range(rng.randint(20, 50))]
        return [15, *name, 16, *noise, 1], [*name, 1]

    fixed = [example() for _ in range(5000)]
    model = demo_models.make_model(demo_models.FULL.target, V, seed=1)  # the demo target's own shape
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    model.train()
    start, ema = time.time(), None
    for step in range(args.steps):
        lr = args.lr * min(1, (step + 1) / 50) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        if args.data == "fresh":
            batch = [example() for _ in range(32)]
        else:
            batch = [fixed[i] for i in rng.sample(range(5000), 32)]
        x = torch.zeros(32, max(len(s) for s, _ in batch), dtype=torch.long)
        y = torch.full((32, max(len(t) for _, t in batch)), -100)
        for r, (s, t) in enumerate(batch):
            x[r, :len(s)] = torch.tensor(s)
            y[r, :len(t)] = torch.tensor(t)
        dec = torch.cat([torch.zeros(32, 1, dtype=torch.long), y[:, :-1].clamp(min=0)], 1)
        loss = model(input_ids=x, attention_mask=(x != 0).long(), decoder_input_ids=dec, labels=y).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if (step + 1) % args.log_every == 0:
            print(f"step {step + 1} loss {ema:.3f} ({time.time() - start:.0f} s)", flush=True)

    model.eval()

    def generate(source: list[int]) -> list[int]:
        return model.generate(input_ids=torch.tensor([source]), max_new_tokens=8, do_sample=False)[0, 1:].tolist()

    with torch.inference_mode():
        exact = sum(generate(s)[:len(t)] == t for s, t in (example() for _ in range(50)))
        rng.seed(99)
        first = by_position = in_input = total = 0
        for _ in range(100):
            source, label = example()
            name, out = label[:-1], generate(source)
            first += out[0] == name[0]
            by_position += sum(a == b for a, b in zip(out, name, strict=False))
            in_input += sum(o in source for o in out[:len(name)])
            total += len(name)
    print(f"{args.data} data, lr {args.lr}, {args.steps} steps: final loss {ema:.3f}; "
          f"new names: exact copies {exact}/50, "
          f"first token right {first}/100, tokens right by position {by_position}/{total}, "
          f"output tokens found in the input {in_input}/{total}")


if __name__ == "__main__":
    main()
