"""``dtorch.nn.functional`` by family (PyTorch's documentation groups);
``dtorch/nn/functional.py`` re-exports every name."""
