"""``dtorch.utils.summary``: a torchsummary-style table of a model's
layers, output shapes and parameter counts."""

__all__ = ["summary"]


def summary(model, input_size, batch_size=-1, device="cpu", dtypes=None):
    raise NotImplementedError("summary needs dtorch.nn")
