"""A small CNN fed by a DataLoader with two persistent worker processes, which send each
batch back to the job through shared memory (Note [Tensors from other processes] in
teraio/walk.py). Writes the losses."""

import argparse
import json

import torch
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        image = torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(i))
        return (image - image.mean()) / (image.std() + 1e-5), torch.tensor(i % 10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="loader_workers.json")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Images(), batch_size=16, shuffle=True, num_workers=2, persistent_workers=True,
                        generator=torch.Generator().manual_seed(5))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10)).to(args.device)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    losses = []
    for (images, labels), _ in zip(loader, range(args.steps)):
        images, labels = images.to(args.device), labels.to(args.device)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
