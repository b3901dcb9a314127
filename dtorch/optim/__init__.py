"""``dtorch.optim``: optimizers and learning-rate schedulers with
``torch.optim``'s API, update formulas and ``state_dict`` format."""
from .optimizer import Optimizer
from .sgd import SGD
from .adam import Adam, AdamW
from .rmsprop import RMSprop
from .adagrad import Adagrad
from .adadelta import Adadelta
from .lbfgs import LBFGS
from .adamax import Adamax
from .nadam import NAdam
from .radam import RAdam
from .rprop import Rprop
from .asgd import ASGD
from . import lr_scheduler

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad",
           "Adadelta", "LBFGS", "Adamax", "NAdam", "RAdam", "Rprop", "ASGD",
           "lr_scheduler"]
