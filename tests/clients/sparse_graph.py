"""A graph layer whose adjacency is a sparse COO tensor built in the forward from learned edge
weights (torch.sparse.mm), so the sparse tensor's values are activations that its backward
reads. Writes the losses."""

import argparse
import json

import torch

NODES, EDGES, FEATURES = 256, 2048, 64


class EdgeWeightedGraph(torch.nn.Module):
    def __init__(self, edges):
        super().__init__()
        self.edges = edges
        self.edge_logits = torch.nn.Parameter(torch.zeros(EDGES))
        self.lin1 = torch.nn.Linear(FEATURES, FEATURES)
        self.lin2 = torch.nn.Linear(FEATURES, 4)

    def forward(self, x):
        adjacency = torch.sparse_coo_tensor(self.edges, torch.sigmoid(self.edge_logits), (NODES, NODES),
                                            check_invariants=False)
        h = torch.relu(torch.sparse.mm(adjacency, self.lin1(x)))
        return self.lin2(torch.sparse.mm(adjacency, h))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="sparse_graph.json")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    edges = torch.randint(0, NODES, (2, EDGES))
    model = EdgeWeightedGraph(edges)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, labels = torch.randn(NODES, FEATURES), torch.randint(0, 4, (NODES,))
    losses = []
    for _ in range(args.steps):
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
