"""An MLP scripted with torch.jit.script and trained with AdamW, which saves the scripted
model, and a traced one sharing its weights, with torch.jit.save between steps (to a path and to
a buffer) and loads them back: the
files must hold the weights' true values when a plan has moved them out. torch.jit.save
writes storages in C++, through no ATen op; a moved weight was written as 0 bytes and the file
failed to load ("require a storage of at least 12800 bytes"). Writes the losses and a digest of
what each load read back, bit for bit.

    python jit_saved.py --out jit_saved.json
"""

import argparse
import io
import json

import torch

WIDTH, DEPTH, BATCH, STEPS, SAVE_AT = 64, 4, 16, 8, 5


def digest(module) -> dict:
    return {name: value.detach().numpy().tobytes().hex() for name, value in module.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="jit_saved.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    eager = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                  for _ in range(DEPTH)])
    model = torch.jit.script(eager)   # trains; shares the eager module's parameters
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, target = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    with torch.no_grad():   # traced before training, saved later: its weights move meanwhile
        traced = torch.jit.trace(eager, inputs)   # a TracedModule over the same parameters
    losses, loaded = [], {}
    for step in range(STEPS):
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step == SAVE_AT:   # a save brings every weight back: the traced one a step later
            path = args.out + ".jit.pt"
            torch.jit.save(model, path)
            buffer = io.BytesIO()
            torch.jit.save(model, buffer)
            buffer.seek(0)
            loaded.update(path=digest(torch.jit.load(path)), buffer=digest(torch.jit.load(buffer)))
        if step == SAVE_AT + 1:
            buffer = io.BytesIO()
            torch.jit.save(traced, buffer)
            buffer.seek(0)
            loaded["traced"] = digest(torch.jit.load(buffer))
    with open(args.out, "w") as f:
        json.dump({"losses": [loss.hex() for loss in losses], "loaded": loaded}, f)


if __name__ == "__main__":
    main()
