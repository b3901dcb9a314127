"""PixelShuffle / PixelUnshuffle (sub-pixel convolution's rearrangement):
one functional call each, made by ``_more._simple``."""
from ._more import PixelShuffle, PixelUnshuffle  # noqa: F401
