"""What turns the sampler's keys into batches, in the main process or a
worker: one fetcher for a map-style dataset, one for an iterable one (with
its position, for resumption)."""
from .sampler import Sampler


class _InfiniteConstantSampler(Sampler):
    """Endless ``None`` keys: an IterableDataset ignores them."""

    def __iter__(self):
        while True:
            yield None


class _MapFetcher:
    def __init__(self, dataset, auto_collation, collate_fn, drop_last,
                 state=None):
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn

    def fetch(self, index):
        if self.auto_collation:
            getitems = getattr(self.dataset, "__getitems__", None)
            if getitems is not None:
                data = getitems(index)
            else:
                data = [self.dataset[i] for i in index]
        else:
            data = self.dataset[index]
        return self.collate_fn(data)

    def state(self):
        return None


class _IterableFetcher:
    """Pulls samples from ``iter(dataset)``; its ``state`` is the
    iterator's (or dataset's) own ``state_dict`` when it has one, else
    the number of samples pulled so far."""

    def __init__(self, dataset, auto_collation, collate_fn, drop_last,
                 state=None):
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.ended = False
        self.pulled = 0
        kind = state and state["kind"]
        if kind == "dataset":
            dataset.load_state_dict(state["state"])
        self.it = iter(dataset)
        if kind == "iterator":
            self.it.load_state_dict(state["state"])
        elif kind == "count":
            for _ in range(int(state["state"])):
                try:
                    next(self.it)
                except StopIteration:
                    break
                self.pulled += 1
        if state is not None and state.get("ended"):
            self.ended = True

    def _next(self):
        item = next(self.it)
        self.pulled += 1
        return item

    def fetch(self, index):
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            try:
                return self.collate_fn(self._next())
            except StopIteration:
                self.ended = True
                raise
        data = []
        for _ in index:
            try:
                data.append(self._next())
            except StopIteration:
                self.ended = True
                break
        if not data or (self.ended and self.drop_last):
            raise StopIteration
        return self.collate_fn(data)

    def state(self):
        if hasattr(self.it, "state_dict"):
            s = {"kind": "iterator", "state": self.it.state_dict()}
        elif hasattr(self.dataset, "state_dict"):
            s = {"kind": "dataset", "state": self.dataset.state_dict()}
        else:
            s = {"kind": "count", "state": self.pulled}
        s["ended"] = self.ended
        return s


class _MakeFetcher:
    """Builds the fetcher inside each worker (picklable for spawn)."""

    def __init__(self, kind, auto_collation, collate_fn, drop_last):
        self.kind = kind
        self.args = (auto_collation, collate_fn, drop_last)

    def __call__(self, dataset, state=None):
        return self.kind(dataset, *self.args, state=state)
