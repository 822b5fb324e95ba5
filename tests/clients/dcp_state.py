"""An MLP trained with plain SGD that sets its gradients to None after every step, then saves
its model and optimizer state the way torch.distributed.checkpoint collects them
(get_optimizer_state_dict): for a stateless optimizer without gradients that steps the
optimizer once more, with zero gradients and a zero learning rate, to create its state.
Writes the losses; the state goes to --save with torch.save.
"""

import argparse
import json

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--losses-out", default="dcp_state.json")
    parser.add_argument("--save", default="state.pt")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 128))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    inputs, target = torch.randn(32, 128), torch.randn(32, 128)
    losses = []
    for _ in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item().hex())
    with open(args.losses_out, "w") as f:
        json.dump(losses, f)
    torch.save({"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)},
               args.save)


if __name__ == "__main__":
    main()
