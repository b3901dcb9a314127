"""Differentiable primitives (see primitives.py)."""
from .primitives import *  # noqa: F401,F403
from .primitives import (unbroadcast, promote, Op, _is_basic,  # noqa: F401
                         _device_error, index_add0)
