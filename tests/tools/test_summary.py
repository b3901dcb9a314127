"""dtorch.utils.summary: the torchsummary table."""
import dtorch
import dtorch.nn as nn


def test_cnn_table(capsys):
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(64 * 5 * 5, 10))
    text = dtorch.utils.summary(model, (1, 28, 28))
    assert capsys.readouterr().out.strip() == text.strip()
    lines = text.splitlines()
    assert lines[1].split() == ["Layer", "(type)", "Output", "Shape",
                                "Param", "#"]
    assert lines[3].split() == ["Conv2d-1", "[-1,", "32,", "26,", "26]",
                                "320"]
    assert "MaxPool2d-6" in text and "[-1, 64, 5, 5]" in text
    assert lines[10].split()[0] == "Linear-8"
    assert lines[10].split()[-1] == "16,010"
    assert "Total params: 34,826" in text
    assert "Trainable params: 34,826" in text
    assert "Non-trainable params: 0" in text
    # the model's hooks are gone afterwards
    assert all(not m._forward_hooks for m in model.modules())


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.rnn = nn.LSTM(4, 6, batch_first=True)
        self.head = nn.Linear(6 + 3, 2)
        self.head.weight.requires_grad_(False)

    def forward(self, x, z):
        out, _ = self.rnn(self.emb(x.long()))
        return self.head(dtorch.cat([out[:, -1], z], 1))


def test_multiple_inputs_nested_outputs_and_frozen(capsys):
    m = TwoInputs()
    text = dtorch.utils.summary(m, [(5,), (3,)], batch_size=8,
                                dtypes=[dtorch.float32, dtorch.float32])
    lstm = next(line for line in text.splitlines() if "LSTM-2" in line)
    # all four LSTM parameters count: 4*6*(4+6) + 2*4*6
    assert lstm.split()[-1] == f"{4 * 6 * (4 + 6) + 2 * 4 * 6:,}"
    # output, (h, c): only the output's leading dim is the batch
    assert "[[8, 5, 6], [[1, 2, 6], [1, 2, 6]]]" in lstm
    total = sum(p.numel() for p in m.parameters())
    assert f"Total params: {total:,}" in text
    assert f"Non-trainable params: {2 * 9:,}" in text
