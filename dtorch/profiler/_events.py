"""Profiler results: FunctionEvent, FunctionEventAvg, EventList and the
summary table in PyTorch's layout (``torch.autograd.profiler_util``)."""
from collections import OrderedDict


def _format_time(us):
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _format_pct(x, total):
    return f"{(100.0 * x / total) if total else 0.0:.2f}%"


class FunctionEvent:
    """One timed range: an op's forward, a backward node, a
    ``record_function`` scope or a module's forward. Times in microseconds."""

    def __init__(self, id, name, thread, start_us, end_us, input_shapes=None,
                 kind="op", rank=None):
        self.id = id
        self.name = name
        self.thread = thread
        self.start_us = start_us
        self.end_us = end_us
        self.input_shapes = input_shapes
        self.kind = kind
        self.rank = rank
        self.cpu_parent = None
        self.cpu_children = []
        self.count = 1
        self.device_type = "CPU"

    @property
    def key(self):
        return self.name

    @property
    def cpu_time_total(self):
        return self.end_us - self.start_us

    @property
    def self_cpu_time_total(self):
        return self.cpu_time_total - sum(c.cpu_time_total
                                         for c in self.cpu_children)

    @property
    def cpu_time(self):
        return self.cpu_time_total

    # no device timing: dtorch times host-side dispatch (see profile)
    self_device_time_total = device_time_total = 0.0
    self_cuda_time_total = cuda_time_total = 0.0

    def __repr__(self):
        return (f"<FunctionEvent id={self.id} name={self.name} "
                f"cpu_time={_format_time(self.cpu_time_total)} "
                f"start_us={self.start_us:.3f} end_us={self.end_us:.3f} "
                f"input_shapes={self.input_shapes}>")


class FunctionEventAvg:
    """The events of one key (and input shapes, when grouped by them)."""

    def __init__(self, key, input_shapes=None):
        self.key = key
        self.input_shapes = input_shapes
        self.count = 0
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self_device = 0.0
        self.self_device_time_total = self.device_time_total = self_device
        self.self_cuda_time_total = self.cuda_time_total = self_device

    def add(self, ev):
        self.count += ev.count
        self.cpu_time_total += ev.cpu_time_total
        self.self_cpu_time_total += ev.self_cpu_time_total
        return self

    @property
    def cpu_time(self):
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def self_cpu_time(self):
        return self.self_cpu_time_total / self.count if self.count else 0.0

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key} count={self.count} "
                f"self_cpu_time={_format_time(self.self_cpu_time_total)} "
                f"cpu_time={_format_time(self.cpu_time)} "
                f"input_shapes={self.input_shapes}>")


class EventList(list):
    """A list of events with PyTorch's ``table``/``key_averages``."""

    def key_averages(self, group_by_input_shape=False):
        groups = OrderedDict()
        for ev in self:
            shapes = str(ev.input_shapes) if group_by_input_shape else None
            k = (ev.key, shapes)
            avg = groups.get(k)
            if avg is None:
                avg = groups[k] = FunctionEventAvg(
                    ev.key, ev.input_shapes if group_by_input_shape
                    else None)
            avg.add(ev)
        return EventList(groups.values())

    def total_average(self):
        tot = FunctionEventAvg("Total")
        for ev in self:
            tot.add(ev)
        return tot

    @property
    def self_cpu_time_total(self):
        return sum(ev.self_cpu_time_total for ev in self)

    def table(self, sort_by=None, row_limit=100, max_name_column_width=55,
              max_shapes_column_width=80, header=None,
              top_level_events_only=False):
        """The summary table, laid out as PyTorch's."""
        events = list(self)
        if not events:
            return ""
        if top_level_events_only:
            events = [e for e in events
                      if getattr(e, "cpu_parent", None) is None]
        if sort_by is not None:
            key = sort_by.replace("cuda", "device")
            if not hasattr(events[0], key):
                raise AttributeError(
                    f"sort_by={sort_by!r}: events have no such attribute "
                    f"(use e.g. 'self_cpu_time_total', 'cpu_time_total', "
                    f"'count')")
            events.sort(key=lambda e: getattr(e, key), reverse=True)
        shapes = any(e.input_shapes for e in events)
        name_w = min(max(len(e.key) for e in events) + 4,
                     max_name_column_width)
        shape_w = min(max(len(str(e.input_shapes)) for e in events) + 4,
                      max_shapes_column_width)
        heads = ["Name", "Self CPU %", "Self CPU", "CPU total %",
                 "CPU total", "CPU time avg", "# of Calls"]
        widths = [name_w] + [12] * 6
        if shapes:
            heads.append("Input Shapes")
            widths.append(shape_w)
        fmt = "".join("{:>" + str(w) + "}  " for w in widths)
        line = "".join("-" * w + "  " for w in widths)
        total = sum(e.self_cpu_time_total for e in self)
        out = []
        if header is not None:
            out += ["=" * len(line), header]
        out += [line, fmt.format(*heads), line]
        for e in events[:row_limit] if row_limit and row_limit > 0 \
                else events:
            name = e.key
            if len(name) >= name_w - 3:
                name = name[:name_w - 3 - 3] + "..."
            count = e.count
            row = [name, _format_pct(e.self_cpu_time_total, total),
                   _format_time(e.self_cpu_time_total),
                   _format_pct(e.cpu_time_total, total),
                   _format_time(e.cpu_time_total),
                   _format_time(e.cpu_time_total / count if count else 0),
                   count]
            if shapes:
                s = str(e.input_shapes)
                if len(s) >= shape_w - 3:
                    s = s[:shape_w - 3 - 3] + "..."
                row.append(s)
            out.append(fmt.format(*row))
        out.append(line)
        out.append(f"Self CPU time total: {_format_time(total)}")
        return "\n".join(out) + "\n"

    def __str__(self):
        return self.table()
