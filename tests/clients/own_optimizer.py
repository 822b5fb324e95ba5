"""A loop with an optimizer of its own, as fastai's are: Adam written by hand, its state two
lists of tensors the optimizer holds (no torch.optim, so the walk cannot name them: kind
`other`), the step marked with teraio_step(). Writes the losses (float.hex) and the final
weights and state to --out."""

import argparse

import torch

from teraio.walk import teraio_step


class HandAdam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        self.exp_avg, self.exp_avg_sq = [], []   # made at the first step, as Adam's are

    @torch.no_grad()
    def step(self):
        if not self.exp_avg:
            self.exp_avg = [torch.zeros_like(p) for p in self.params]
            self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.t += 1
        b1, b2 = self.betas
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (v / (1 - b2 ** self.t)).sqrt_().add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / (1 - b1 ** self.t))
        teraio_step()

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="own.pt")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU())
                                  for _ in range(6)], torch.nn.Linear(128, 1))
    optimizer = HandAdam(model.parameters())
    data = torch.randn(args.steps, 32, 128)
    losses = []
    for step in range(args.steps):
        loss = model(data[step]).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item().hex())
    torch.save({"losses": losses, "model": model.state_dict(), "exp_avg": optimizer.exp_avg,
                "exp_avg_sq": optimizer.exp_avg_sq}, args.out)


if __name__ == "__main__":
    main()
