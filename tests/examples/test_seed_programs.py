"""The seeds' programs, unchanged but for ``import dtorch as torch``."""
import numpy as np

import dtorch as torch
import dtorch.nn as nn


def test_simple_model_training_loop():
    torch.manual_seed(0)

    class SimpleModel(nn.Module):
        def __init__(self):
            super(SimpleModel, self).__init__()
            self.fc = nn.Linear(10, 1)

        def forward(self, x):
            return self.fc(x)

    model = SimpleModel()
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(100, 10)
    true_w = torch.randn(10, 1)
    y = x @ true_w + 0.1 * torch.randn(100, 1)
    first = None
    for epoch in range(100):
        optimizer.zero_grad()
        outputs = model(x)
        loss = criterion(outputs, y)
        loss.backward()
        optimizer.step()
        if first is None:
            first = loss.item()
    assert loss.item() < 0.2 * first


def test_scalar_autograd_seed():
    x = torch.tensor(2.0, requires_grad=True)
    y = x * 3
    z = y + 1
    z.backward()
    assert x.grad.item() == 3.0


def test_cnn_seed_forward_backward_and_training():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 10))
    x = torch.randn(8, 1, 28, 28)
    out = model(x)
    assert out.shape == (8, 10)
    target = torch.randint(0, 10, (8,))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        loss = loss_fn(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(p.grad is not None for p in model.parameters())
    assert losses[-1] < 0.5 * losses[0]


def test_embedding_lstm_text_model():
    torch.manual_seed(0)

    class TextModel(nn.Module):
        def __init__(self, vocab_size, embed_dim, hidden_dim, num_classes):
            super().__init__()
            self.embedding = nn.Embedding(vocab_size, embed_dim,
                                          padding_idx=0)
            self.lstm = nn.LSTM(embed_dim, hidden_dim, batch_first=True)
            self.fc = nn.Linear(hidden_dim, num_classes)

        def forward(self, x):
            embedded = self.embedding(x)
            output, (hidden, cell) = self.lstm(embedded)
            return self.fc(hidden[-1])

    model = TextModel(50, 16, 32, 3)
    x = torch.randint(1, 50, (6, 12))
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert model.embedding.weight.grad[0].abs().sum().item() == 0
    assert model.lstm.weight_hh_l0.grad is not None
    assert losses[-1] < 0.1 * losses[0]
    pred = model(x).argmax(1)
    assert np.array_equal(pred.numpy(), y.numpy())
