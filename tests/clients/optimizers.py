"""A small MLP trained by the torch.optim optimizers and LR schedulers the flags name, for
tests/test_optimizers.py. Each --opt is NAME or NAME:KEY=VALUE,... (Python literals:
`adamw:amsgrad=True,foreach=False`, `adam:betas=(0.8,0.9)`); with several, the linear layers
are dealt out among them in turn and each steps after every backward (one optimizer per layer
group). LBFGS steps with a closure, alone. The i-th --sched puts an LR scheduler on the i-th
optimizer: plateau (ReduceLROnPlateau, fed the loss), onecycle, sequential (LinearLR then
ExponentialLR). Writes the losses (float.hex) and the final state dicts of the model, the
optimizers and the schedulers to --out (torch.save)."""

import argparse
import ast

import torch

OPTIMIZERS = {name.lower(): getattr(torch.optim, name) for name in (
    "SGD", "Adam", "AdamW", "NAdam", "RAdam", "Adagrad", "Adadelta", "Adamax", "ASGD", "RMSprop", "Rprop",
    "Adafactor", "LBFGS")}
LR = {"sgd": 0.05, "asgd": 0.05, "adagrad": 0.05, "adadelta": 1.0, "rprop": 1e-3, "lbfgs": 0.5}


def parse_opt(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    call = ast.parse(f"f({rest})", mode="eval").body
    return name.lower(), {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def make_optimizers(model: torch.nn.Sequential, specs: list[str], groups: bool) -> list[torch.optim.Optimizer]:
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    optimizers = []
    for i, spec in enumerate(specs):
        name, kwargs = parse_opt(spec)
        lr = kwargs.pop("lr", LR.get(name, 1e-2))
        mine = layers[i::len(specs)]
        if groups:   # a group per layer, each at its own rate
            params = [{"params": list(layer.parameters()), "lr": lr * (1 - j / 10)} for j, layer in enumerate(mine)]
        else:
            params = [{"params": [p for layer in mine for p in layer.parameters()], "lr": lr}]
        optimizers.append(OPTIMIZERS[name](params, **kwargs))
    return optimizers


def make_scheduler(name: str, optimizer: torch.optim.Optimizer, steps: int):
    s = torch.optim.lr_scheduler
    if name == "plateau":
        return s.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.5)
    if name == "onecycle":
        return s.OneCycleLR(optimizer, max_lr=0.05, total_steps=steps)
    return s.SequentialLR(optimizer, [s.LinearLR(optimizer, 0.1, total_iters=3), s.ExponentialLR(optimizer, 0.8)],
                          milestones=[3])


def train(model, optimizers, schedulers, args) -> list[str]:
    batches = [(torch.randn(64, 64), torch.randn(64, 8)) for _ in range(4)]
    losses = []

    def closure(i: int):
        def forward_backward():
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=not args.keep_grads)
            x, y = batches[i % len(batches)]
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            if args.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            return loss
        return forward_backward

    for step in range(args.steps):
        if isinstance(optimizers[0], torch.optim.LBFGS):
            loss = optimizers[0].step(closure(step))
        else:
            loss = closure(step)()
            for optimizer in optimizers:
                optimizer.step()
        for scheduler in schedulers:
            plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
            scheduler.step(*[loss] * plateau)
        losses.append(loss.item().hex())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--opt", action="append", required=True)
    parser.add_argument("--sched", choices=("plateau", "onecycle", "sequential"), action="append", default=[])
    parser.add_argument("--groups", action="store_true", help="a param group per layer")
    parser.add_argument("--keep-grads", action="store_true", help="zero_grad(set_to_none=False)")
    parser.add_argument("--clip", action="store_true", help="clip_grad_norm_ before the steps")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default="optimizers.pt")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), *(m for _ in range(4) for m in (
        torch.nn.Tanh(), torch.nn.Linear(128, 128))), torch.nn.Tanh(), torch.nn.Linear(128, 8))
    optimizers = make_optimizers(model, args.opt, args.groups)
    schedulers = [make_scheduler(name, optimizer, args.steps) for name, optimizer in zip(args.sched, optimizers)]
    losses = train(model, optimizers, schedulers, args)
    torch.save({"losses": losses, "model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                "schedulers": [s.state_dict() for s in schedulers]}, args.out)


if __name__ == "__main__":
    main()
