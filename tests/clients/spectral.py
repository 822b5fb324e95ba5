"""A spectral filter layer: rfft over the sequence, a product with a complex parameter,
irfft back (complex activations, gradients and Adam state). Writes the losses."""

import argparse
import json

import torch

LENGTH, CHANNELS = 64, 32


class SpectralFilter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.filter = torch.nn.Parameter(torch.randn(LENGTH // 2 + 1, CHANNELS, dtype=torch.cfloat) * 0.1)
        self.mix = torch.nn.Linear(CHANNELS, CHANNELS)

    def forward(self, x):
        spectrum = torch.fft.rfft(x, dim=1)
        return self.mix(torch.fft.irfft(spectrum * self.filter, n=LENGTH, dim=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="spectral.json")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(SpectralFilter(), torch.nn.GELU(), SpectralFilter())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(16, LENGTH, CHANNELS)
        loss = (model(x) - x.roll(1, dims=1)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
