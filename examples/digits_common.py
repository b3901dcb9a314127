"""What the digits examples share: the data (scikit-learn's bundled 8x8
digits, no download), the CNN, and evaluation. PyTorch code with
``import dtorch as torch``."""
import numpy as np

import dtorch as torch
from dtorch import nn


def load_digits_split(test_fraction=0.2, seed=0):
    """(x_train, y_train, x_test, y_test) as tensors; x is N x 1 x 8 x 8 in
    [0, 1]. The split is fixed by ``seed``."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (torch.from_numpy(x[train]), torch.from_numpy(y[train]),
            torch.from_numpy(x[test]), torch.from_numpy(y[test]))


class DigitsCNN(nn.Module):
    """Conv(1->16) - ReLU - Conv(16->32) - ReLU - MaxPool - MLP head."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
                                  nn.Dropout(0.1), nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.features(x))


@torch.no_grad()
def evaluate(model, loader):
    """(correct, total, summed loss) over a loader."""
    model.eval()
    correct = total = 0
    loss = 0.0
    for x, y in loader:
        out = model(x)
        loss += nn.functional.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
        total += len(y)
    model.train()
    return correct, total, loss


@torch.no_grad()
def distributed_accuracy(model, loader, group=None):
    """Accuracy over every rank's shard of a loader, the same on all ranks
    (``group``: the ranks whose shards differ, default the world)."""
    from dtorch.distributed.metrics import MetricSum
    model.eval()
    m = MetricSum(group=group)
    for x, y in loader:
        m.update(correct=(model(x).argmax(1) == y).sum(), total=len(y))
    model.train()
    r = m.compute()
    return r["correct"] / r["total"]
