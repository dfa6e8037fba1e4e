"""CPU copies that keep a task's meaning (torch + stdlib; runs inside the probe's sandbox).

The task's size constants (see `pipeline.tasks.probe.dims`) are halved, largest first, until its inputs,
footprint and FLOPs fit the host; derived values follow the file's data flow, tied dims move
together, and a halving that breaks the model (a group count, a pooling chain) is undone.
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.tasks.probe.dims import get_slot, may_tie, set_slot

ALLOC_FAILURE = ("can't allocate memory", "cannot allocate memory", "out of memory")


def is_alloc_failure(text: str) -> bool:
    """True for the host allocator's refusal (the task's sizes are meant for a GPU's memory)."""
    low = text.lower()
    return any(m in low for m in ALLOC_FAILURE)


def input_numel(ns: dict) -> int:
    import torch

    with torch.device("meta"):
        inputs = ns["get_inputs"]()
    return sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))


# The CPU copy's whole footprint (inputs, parameters and buffers, outputs) may be this many times
# the input cap: an embedding lookup with small integer inputs once kept a 512 MB output, an
# outer product of two 8k vectors a 67M-element one, and their CPU verification ran out of time.
FOOTPRINT_FACTOR = 32
# ...and one forward may cost at most this many FLOPs: a SwiGLU MLP copy with 65k inputs still
# did 2.2 GFLOP a call, which a single-threaded CPU kernel timed 25 times does not finish in 60 s.
CPU_MAX_FLOPS = 1 << 28


# A halving must shrink the overshoot by at least this share to be kept: 1000 classes halved
# to 1 for 0.2% of MobileNetV1's FLOPs changed the task and cost ten meta runs of a deep model.
MIN_GAIN = 0.01


def _analytic_rnns(model, flops: list[float]) -> None:
    """Give each LSTM/GRU/RNN of a meta `model` a forward that returns outputs of the right
    shapes at once and adds its FLOPs to `flops[0]`: run step by step on meta, a 6-layer LSTM
    over 512 steps took 40 s, the whole time budget, before any scaling."""
    import torch

    def analytic(m):
        original = m.forward
        gates = {"LSTM": 4, "GRU": 3}.get(m.mode, 1)
        dirs = 2 if m.bidirectional else 1
        proj = m.proj_size or m.hidden_size

        def forward(x, hx=None):
            if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
                return original(x, hx)
            batched = x.dim() == 3
            steps, batch = ((x.shape[1], x.shape[0]) if m.batch_first else x.shape[:2]
                            ) if batched else (x.shape[0], 1)
            width = x.shape[-1]
            for _ in range(m.num_layers):
                flops[0] += dirs * 2.0 * gates * m.hidden_size * (width + proj) * batch * steps
                width = dirs * proj
            out = x.new_empty(*x.shape[:-1], dirs * proj)
            lead = (dirs * m.num_layers, batch) if batched else (dirs * m.num_layers,)
            h = x.new_empty(*lead, proj)
            return (out, (h, x.new_empty(*lead, m.hidden_size))) if m.mode == "LSTM" else (out, h)

        m.forward = forward

    for mod in model.modules():
        if isinstance(mod, torch.nn.RNNBase):
            analytic(mod)


def meta_items():
    """A dispatch mode in which `.item()` of a meta tensor is a placeholder (0.0, False or 1)
    instead of an error: Swin's `[x.item() for x in torch.linspace(0, rate, depth)]` drop-path
    rates built on meta. Values, not shapes, so the shapes and FLOPs stay exact unless a shape
    depends on data (then the real CPU run is the judge)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    scalar = torch.ops.aten._local_scalar_dense.default

    class MetaItems(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is scalar and args[0].device.type == "meta":
                t = args[0]
                return 0.0 if t.is_floating_point() else False if t.dtype == torch.bool else 1
            return func(*args, **(kwargs or {}))

    return MetaItems()


def footprint(ns: dict, strict: bool = False) -> tuple[int, float]:
    """(elements of the inputs, parameters, buffers and outputs; FLOPs) of one forward on meta.
    The inputs alone and 0 FLOPs when the model cannot be built or run on meta (with `strict`,
    that raises instead)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        inputs = ns["get_inputs"]()
    total = sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))
    try:
        with torch.device("meta"), torch.no_grad(), meta_items():
            model = ns["Model"](*ns["get_init_inputs"]())
            rnn_flops = [0.0]
            _analytic_rnns(model, rnn_flops)
            with FlopCounterMode(display=False) as counter:
                out = model(*inputs)
    except Exception:  # noqa: BLE001 - no meta kernel for some op: inputs only
        if strict:
            raise
        return total, 0.0
    total += sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    outs = out if isinstance(out, list | tuple) else [out]
    total += sum(o.numel() for o in outs if isinstance(o, torch.Tensor))
    return total, float(counter.get_total_flops()) + rnn_flops[0]


def scale_constants(ns: dict, constants: dict[str, int], cap: int,
                    input_numel: Callable[[], int],
                    cost: Callable[[], tuple[int, float]] | None = None,
                    refresh: Callable[[dict], None] | None = None,
                    partners: dict[str, int] | None = None) -> dict[str, int]:
    """Halve the largest dim constants until `input_numel()` fits `cap` and, when `cost` (see
    `footprint`) is given, the footprint fits FOOTPRINT_FACTOR * cap and the FLOPs
    CPU_MAX_FLOPS; a halving that does not shrink the largest overshoot (by MIN_GAIN) is undone (and retried
    after the next halving that does), and so is one that makes `cost` raise where it did not
    before (a group count no longer dividing channels, a pooling chain left with 0 pixels).
    A constant whose halving alone is undone is tried again together with each of its ties (the
    other constants and `partners`, see `tie_partners`, of the same value), then with all: a
    batch size that must equal a broadcast dim, an image size that must equal the model's
    default.
    `refresh(ns)` (see `derived_refresher`) recomputes the values derived from the constants
    after each change.

    `ns` is the task module's namespace, changed in place; returns the slots it changed.
    """
    use_cost = cost is not None
    if use_cost:
        try:
            cost()
        except Exception:  # noqa: BLE001 - the model does not run on meta: bound the inputs
            use_cost = False
    partners = partners or {}

    def excess() -> float:
        if refresh is not None:
            refresh(ns)
        over = input_numel() / cap
        if use_cost:
            elements, flops = cost()
            over = max(over, elements / (cap * FOOTPRINT_FACTOR), flops / CPU_MAX_FLOPS)
        return over

    scaled: dict[str, int] = {}
    broken: set[frozenset] = set()

    def untouched(k: str) -> bool:  # not moved by a refresh since we last set it
        return get_slot(ns, k) == scaled.get(k, {**partners, **constants}.get(k))

    def attempt(keys: list[str], size: float) -> float | None:
        """Halve `keys` together; keep it and return the new excess if it shrank, else undo."""
        old = {k: get_slot(ns, k) for k in keys}
        trial = frozenset((k, max(1, old[k] // 2)) for k in keys)
        if trial in broken:  # raised before: other dims shrinking does not mend a pooling chain
            return None
        for k, v in trial:
            set_slot(ns, k, v)
        try:
            new = excess()
        except Exception:  # noqa: BLE001 - a dim that breaks the task is not scalable this far
            broken.add(trial)
            new = size
        if new < size * (1.0 - MIN_GAIN):
            scaled.update({k: get_slot(ns, k) for k in keys})
            return new
        for k in keys:
            set_slot(ns, k, old[k])
        if refresh is not None:
            refresh(ns)
        return None

    useless: set[str] = set()
    size = excess()
    while size > 1:
        live = [k for k in constants if k not in useless and untouched(k) and ns[k] >= 2]
        if not live:
            break
        name = max(live, key=lambda k: ns[k])
        new = attempt([name], size)
        if new is None:
            ties = [k for k in (*constants, *partners) if k != name and untouched(k)
                    and get_slot(ns, k) == ns[name] and may_tie(name, k)]
            # one partner at a time first: equal values at small sizes are often coincidence
            for group in [[name, k] for k in ties] + ([[name, *ties]] if len(ties) > 1 else []):
                new = attempt(group, size)
                if new is not None:
                    break
        if new is None:
            useless.add(name)
            continue
        size = new
        useless.clear()  # a dim that did not help before may help now (the other bound leads)
    return scaled
