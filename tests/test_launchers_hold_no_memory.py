"""No launcher, and no family module, keeps a tensor from one call to the next.

Under torch.compile's CUDA graphs (``mode="reduce-overhead"``, cudagraph trees) the first call of
a compiled graph runs inside the graphs' private memory pool, which hands the memory of every
tensor it does not see returned to the next graph's tensors. A tensor a launcher keeps from that
call (scratch made once and reused, arrival counters zeroed at the first call, a cached table)
would then share its memory with another graph's tensors: each overwrites the other. That is how
decode_matmul's split-K launcher, which kept its int32 arrival counters in its closure, became a
suspect for an illegal-address crash in Hugging Face ``generate()`` (fixed in 49feb5b; its own
test is ``test_split_k_launchers_keep_no_device_memory_between_calls`` of
tests/interpreter/test_decode_matmul_kernels.py). Scratch must be allocated per call.

This test holds every variant of every family to that: each builds configs covering its
parameters' values at a few small workloads (:data:`WORKLOADS`: the default constants and others
that change the operands), launches each twice on fresh inputs of the family's first distribution
into outputs allocated as the harness allocates them, and then asserts three things:

1. the launcher holds no tensor: nothing reachable from it (closure cells, default arguments, the
   attributes of the objects it closes over such as a ``DirectLaunch``, bound methods, partials,
   ``functools.cache`` tables, containers) is a ``torch.Tensor``;
2. no family module gained one: the tensors reachable from the globals of every ``kernelsmith``
   module (and the attributes of the classes they define) are the same after the calls as before;
3. nothing else did either: once the inputs and outputs are dropped, every tensor alive (Python's
   garbage collector tracks them all) was alive before the first call. This catches a tensor
   kept where the walks of 1 and 2 do not look (a C-level cache, a triton object); the report
   then names what refers to it.

The interpreter runs on CPU, so a device tensor cannot be told from a host one here: a family that
wants to cache a host-side table must cache something that is not a tensor (a tuple, a Python
number), and none does today. The probes at the end show that each check fails on what it is
for; pointed at the launchers of decode_matmul's split_k and persistent variants built from the
source before 49feb5b, the sweep fails after their first call, on ``launcher.<counters>``.
"""

from __future__ import annotations

import collections
import functools
import gc
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch

from kernelsmith.evaluate.validate import Prefill, allocate_outputs
from kernelsmith.ops import _launch, get_op, op_names
from kernelsmith.ops._base import OpFamily, Variant
from kernelsmith.ops._launch import DirectLaunch
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

Shape = tuple[int, ...]

# The workloads (shape, constants) of each family: every variant covers its parameters' values
# (below) at each set of constants, over that set's shapes in order. A row-wise family's split_row
# wants rows wider than 4096 elements, the split-K matmuls two K blocks or more; the constants
# take the launchers through their other operands and host paths (a mask, a static cache and its
# lengths, the KV write, a fused prologue or RoPE epilogue, a bias, the concatenated layout...).
Workload = tuple[Shape, dict[str, Any]]
ROWS: tuple[Workload, ...] = (((3, 40), {}), ((1, 4097), {}))
GATED: tuple[Workload, ...] = (((3, 40), {}), ((3, 40), {"layout": "concat"}))
CROSS_ENTROPY: tuple[Workload, ...] = (((3, 40), {}), ((3, 40), {"reduction": "none", "label_smoothing": 0.1}))
LINEAR_CROSS_ENTROPY: tuple[Workload, ...] = (((3, 16, 40), {}), ((3, 16, 40), {"bias": True, "reduction": "none"}))
WORKLOADS: dict[str, tuple[Workload, ...]] = {
    "attention": (((1, 2, 16, 16), {}), ((1, 2, 16, 16), {"causal": True, "kv_heads": 1}),
                  ((1, 2, 16, 16), {"layout": "bshd", "mask": "boolean", "kv_len": 24})),
    "decode_attention": (((1, 2, 16, 16), {}), ((1, 2, 16, 16), {"cache": "static"}),
                         ((1, 2, 16, 16), {"cache": "masked", "kv_heads": 1}),
                         ((1, 2, 16, 16), {"cache": "static", "write_kv": True})),
    "rope": (((1, 2, 4, 16), {}), ((1, 2, 4, 16), {"layout": "bshd", "style": "interleaved", "batched_cos": True}),
             ((1, 2, 4, 16), {"rotary_dim": 8, "kv_heads": 1, "memory": "bshd"})),
    "matmul": (((3, 16, 32), {}), ((1, 16, 64), {}), ((1, 16, 64), {"layout": "matmul", "epilogue": "bias+gelu"}),
               ((1, 16, 64), {"epilogue": "swiglu"})),
    "decode_matmul": (((3, 16, 32), {}), ((1, 16, 64), {}),
                      ((1, 16, 64), {"epilogue": "bias+residual", "prologue": "rmsnorm"}),
                      ((1, 80, 64), {"epilogue": "rope", "rope": (3, 1)})),
    "cross_entropy": CROSS_ENTROPY,
    "cross_entropy_backward": CROSS_ENTROPY,
    "cross_entropy_fused": CROSS_ENTROPY,
    "linear_cross_entropy": LINEAR_CROSS_ENTROPY,
    "linear_cross_entropy_backward": LINEAR_CROSS_ENTROPY,
    "linear_cross_entropy_fused": LINEAR_CROSS_ENTROPY,
    "swiglu": GATED,
    "geglu": (*GATED, ((3, 40), {"layout": "concat", "approximate": "tanh"})),
    "swiglu_backward": GATED,
    "geglu_backward": (*GATED, ((3, 40), {"layout": "concat", "approximate": "tanh"})),
}  # fmt: skip
# Parameters that change what the kernel computes on the GPU but not what the launcher does on
# the host (the interpreter ignores them): the runs need not cover their values.
HOST_BLIND = ("num_warps", "num_stages")


def planned_runs(op: OpFamily, variant: Variant) -> list[tuple[OpSpec, Config]]:
    """(spec, config) runs of a variant at the workloads of :data:`WORKLOADS`.

    At the family's default constants (its first workloads), configs covering every value of
    every parameter the launcher's host code may branch on (SPLIT_K of 1 and more, both REDUCE
    ways, ...), so that a launcher keeping scratch on one path only is met on it. At each other
    set of constants, which changes the operands rather than the schedule, fewer (the interpreter
    is slow): configs covering the values of the parameters that are not numbers (REDUCE,
    TWO_LOOPS, an eviction policy...), one at least."""
    workloads = WORKLOADS.get(op.name, ROWS)
    runs: list[tuple[OpSpec, Config]] = []
    seen: set[tuple[str, str, object]] = set()  # (constants, parameter, value)
    for shape, constants in workloads:
        spec = op.spec(shape, "float32", **constants)
        for config in variant.space(spec).configs():
            items = [(name, value) for name, value in config.items() if name not in HOST_BLIND]
            if constants:
                # (no such parameter: one run, its first config, marked by a pair no config has)
                items = [(name, value) for name, value in items if isinstance(value, (str, bool))] or [("", None)]
            new = {(repr(constants), *item) for item in items} - seen
            if new:
                runs.append((spec, config))
                seen |= new
    assert runs, f"{op.name} {variant.name}: no config at any of {workloads}"
    return runs


# ---- finding the tensors an object keeps -------------------------------------------------------
# Objects the walks never enter: modules and classes are walked only as module state (below), and
# these hold nothing a launcher made.
_OPAQUE = (types.ModuleType, type, str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)


def _edges(obj: Any) -> Iterator[tuple[str, Any]]:
    """(name, value) of what ``obj`` keeps alive, as far as a launcher or a cache can keep a tensor."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{key!r}]", value
            yield f"<key {key!r}>", key
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(obj):
            yield f"[{i}]", value
    elif isinstance(obj, types.FunctionType):
        # a function's own state: its closure, its defaults and its attributes (not its globals,
        # which are module state)
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=True):
            try:
                yield f".<{name}>", cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
        yield ".__defaults__", obj.__defaults__
        yield ".__kwdefaults__", obj.__kwdefaults__
        yield ".__dict__", obj.__dict__
    elif isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
        yield ".__func__", obj.__func__
    elif isinstance(obj, functools.partial):
        yield ".func", obj.func
        yield ".args", obj.args
        yield ".keywords", obj.keywords
    else:
        # instances (a DirectLaunch, a dataclass): their attributes, by name, then everything the
        # collector sees them refer to (named again only where the names above did not reach: a
        # C object such as a functools.cache wrapper, whose referents include its table of results)
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            for attr, value in attributes.items():
                yield f".{attr}", value
        for name in _slots(type(obj)):
            if hasattr(obj, name):
                yield f".{name}", getattr(obj, name)
        for i, value in enumerate(gc.get_referents(obj)):
            if isinstance(value, dict) and isinstance(obj, functools._lru_cache_wrapper):
                yield ".<cache table>", value  # a functools.cache / lru_cache's results by arguments
            else:
                yield f".<referent {i}>", value


def _slots(cls: type) -> tuple[str, ...]:
    """The slot names of ``cls`` and its bases (a slot's value is no referent gc names)."""
    names = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
    return tuple(n for n in names if n not in ("__dict__", "__weakref__"))


def tensors_kept(roots: list[tuple[Any, str]]) -> dict[int, str]:
    """{id: path} of every tensor reachable from the (object, name) ``roots`` by :func:`_edges`.

    No depth limit is needed: modules and classes are never entered, so the walk stays among the
    objects the launchers and the modules own (some 5,000 for all the families' modules). Breadth
    first, so that a path reported is a shortest one."""
    seen: set[int] = set()
    found: dict[int, str] = {}
    pending = collections.deque(roots)
    while pending:
        obj, path = pending.popleft()
        if isinstance(obj, torch.Tensor):
            found.setdefault(id(obj), f"{path}: {type(obj).__name__}{tuple(obj.shape)} {obj.dtype} on {obj.device}")
            continue
        if isinstance(obj, _OPAQUE) or id(obj) in seen:
            continue
        seen.add(id(obj))
        pending += [(value, path + name) for name, value in _edges(obj)]
    return found


def module_state() -> dict[int, str]:
    """{id: path} of the tensors reachable from the globals of every loaded kernelsmith module and
    from the attributes of the classes each defines (caches a family keeps between calls)."""
    roots: list[tuple[Any, str]] = []
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("kernelsmith") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == name:
                roots += [(v, f"{name}.{attr}.{a}") for a, v in vars(value).items()]
            else:
                roots.append((value, f"{name}.{attr}"))
    return tensors_kept(roots)


def live_tensors() -> dict[int, torch.Tensor]:
    """Every tensor alive, by id (the caller holding them keeps their ids from being reused)."""
    gc.collect()
    # (type(), not isinstance: isinstance reads __class__, which some lazy torch objects warn on)
    return {id(obj): obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)}


def referrers(tensor_id: int) -> str:
    """The live tensor ``tensor_id`` and the types of the objects referring to it (frames aside)."""
    tensor = None
    for obj in gc.get_objects():
        if id(obj) == tensor_id and issubclass(type(obj), torch.Tensor):
            tensor = obj
    # (the list gc.get_objects() returned is gone by now: it is not one of the referrers)
    holders = [type(h).__qualname__ for h in gc.get_referrers(tensor) if not isinstance(h, types.FrameType)]
    assert isinstance(tensor, torch.Tensor)
    return f"{type(tensor).__name__}{tuple(tensor.shape)} {tensor.dtype} held by {holders}"


def assert_keep_no_tensors(
    op: OpFamily, launches: list[tuple[OpSpec, Any, str]], device: str = "cpu", calls: int = 2
) -> None:
    """Call each (spec, launcher, what) of ``launches`` ``calls`` times on fresh inputs and outputs;
    assert 1 of the module docstring after each call, 2 and 3 after the last launcher's.

    The launchers stay alive to the end, so that check 3 also sees a tensor one of them keeps
    where check 1 does not look; ``alive_before`` holds every tensor alive at the start, so that
    no new tensor can take the id of one freed meanwhile (and pass for it in checks 2 and 3)."""
    modules_before = module_state()
    alive_before = live_tensors()
    for spec, launcher, what in launches:
        for call in range(calls):
            inputs = op.make_inputs(spec, call, op.distributions[0], device)
            outputs = allocate_outputs(op, spec, device, Prefill("nan"))
            launcher(inputs, outputs)
            kept = tensors_kept([(launcher, "launcher")])
            assert not kept, f"{what} keeps tensors after call {call + 1}: {sorted(kept.values())}"
        del inputs, outputs
    gained = {i: path for i, path in module_state().items() if i not in modules_before}
    assert not gained, f"{op.name}: module state gained tensors: {sorted(gained.values())}"
    left = live_tensors().keys() - alive_before.keys()
    assert not left, f"{op.name}: tensors outlive the calls: {[referrers(i) for i in left]}"


VARIANTS = [pytest.param(name, v.name, id=f"{name}-{v.name}") for name in op_names() for v in get_op(name).variants]


@pytest.mark.slow  # about 140 s on two cores: some 490 configs, each launched twice in the interpreter
@pytest.mark.parametrize(("name", "variant_name"), VARIANTS)
def test_launchers_keep_no_tensor_between_calls(name: str, variant_name: str, device: str) -> None:
    """On a GPU the same runs compile every config, and their second calls launch directly
    (``DirectLaunch``), which the interpreter never does: see also the stand-in test below."""
    op = get_op(name)
    variant = op.variant(variant_name)
    launches = [(spec, variant.build(spec, config), f"{name} {variant_name} {config.key} at {spec.describe()}")
                for spec, config in planned_runs(op, variant)]  # fmt: skip
    assert_keep_no_tensors(op, launches, device)


# ---- the checks can fail ----------------------------------------------------------------------------
# Stand-in launchers of the gelu family (y = x, which no check looks at), each keeping a tensor
# the way a real one could; the plain one shows that the stand-ins fail for what they keep alone.
PROBE = "kernelsmith._launcher_memory_probe"  # a module name the module-state walk reads
_STASH: list[torch.Tensor] = []  # somewhere none of the walks looks: only check 3 can see it


def _probe_launches(launcher: Any) -> tuple[OpFamily, list[tuple[OpSpec, Any, str]]]:
    op = get_op("gelu")
    return op, [(op.spec((3, 40), "float32"), launcher, "the probe")]


def _copy(inputs: Any, outputs: Any) -> None:
    outputs[0].copy_(inputs[0])


def test_a_launcher_keeping_nothing_passes() -> None:
    assert_keep_no_tensors(*_probe_launches(_copy))


def test_counters_kept_in_the_closure_are_found() -> None:
    """decode_matmul's split-K launcher before 49feb5b: arrival counters made at the first call
    and kept, per device, in a dict of its closure."""
    counters: dict[torch.device, torch.Tensor] = {}

    def launch(inputs: Any, outputs: Any) -> None:
        y = outputs[0]
        if counters.get(y.device) is None:
            counters.setdefault(y.device, y.new_zeros(4, dtype=torch.int32))
        _copy(inputs, outputs)

    with pytest.raises(AssertionError, match=r"after call 1: .*launcher\.<counters>\[device\(type='cpu'\)\]"):
        assert_keep_no_tensors(*_probe_launches(launch))


class _Kernel:
    """A launch object (as DirectLaunch is) keeping scratch in an attribute from its second call."""

    def __init__(self) -> None:
        self.calls = 0
        self.scratch: torch.Tensor | None = None

    def __call__(self, y: torch.Tensor) -> None:
        self.calls += 1
        scratch = self.scratch if self.scratch is not None else y.new_empty(y.shape)
        if self.calls > 1:
            self.scratch = scratch


class _SlottedKernel(_Kernel):
    """The same, its attributes in slots (no ``__dict__``), as Config keeps its own."""

    __slots__ = ("calls", "scratch")


@pytest.mark.parametrize("kind", [_Kernel, _SlottedKernel])
def test_scratch_kept_by_an_object_the_launcher_closes_over_is_found(kind: type[_Kernel]) -> None:
    kernel = kind()

    def launch(inputs: Any, outputs: Any) -> None:
        kernel(outputs[0])
        _copy(inputs, outputs)

    with pytest.raises(AssertionError, match=r"after call 2: .*launcher\.<kernel>\.scratch: Tensor\(3, 40\)"):
        assert_keep_no_tensors(*_probe_launches(launch))


class _Compiled:
    """What DirectLaunch uses of a compiled kernel; its ``run`` keeps nothing (a real one hands
    the arguments to the driver)."""

    function = "function-handle"
    packed_metadata = "packed"
    launches = 0

    def run(self, *launch_args: Any) -> None:
        type(self).launches += 1


class _StandInKernel:
    """What DirectLaunch uses of a JITFunction: ``kernel[grid](*args, **meta)`` and ``signature``."""

    signature = inspect.signature(lambda x_ptr, y_ptr, n, BLOCK=128: None)

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **meta: _Compiled()


def test_direct_launch_keeps_no_tensor_it_launched_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter never builds a DirectLaunch (its kernels are no JITFunction), so the family
    sweep meets one only on a GPU: here one records its first call (through "Triton") and launches
    its second directly, on tensors it must not keep (it records their dtypes and alignment)."""
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(_launch, "_current_stream", lambda device: 1234)
    monkeypatch.setattr(_launch, "_hooks_set", lambda: False)
    kernel = DirectLaunch(_StandInKernel(), (3,))

    def launch(inputs: Any, outputs: Any) -> None:
        kernel(inputs[0], outputs[0], outputs[0].numel(), BLOCK=64)
        _copy(inputs, outputs)

    before = _Compiled.launches
    assert_keep_no_tensors(*_probe_launches(launch))
    assert kernel.launches == {"direct": 1, "triton": 1} and _Compiled.launches == before + 1


@pytest.mark.parametrize("cache", ["functools.cache", "class attribute"])
def test_a_table_cached_in_module_state_is_found(cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table cached by a module function or in a class attribute: the launcher looks it up by
    name at each call, so it holds nothing itself (check 1 passes) and check 2 must see it."""
    probe = types.ModuleType(PROBE)

    class Tables:
        cached: ClassVar[dict[int, torch.Tensor]] = {}

    Tables.__module__ = PROBE
    probe.Tables = Tables  # type: ignore[attr-defined]
    probe.table = functools.cache(lambda n: torch.arange(n))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, PROBE, probe)

    def launch(inputs: Any, outputs: Any) -> None:
        module = sys.modules[PROBE]
        if cache == "functools.cache":
            module.table(5)
        else:
            module.Tables.cached.setdefault(5, torch.arange(5))
        _copy(inputs, outputs)

    where = r"table\.<cache table>\[5\]" if cache == "functools.cache" else r"Tables\.cached\[5\]"
    with pytest.raises(AssertionError, match=rf"module state gained tensors: .*{PROBE}\.{where}: Tensor\(5,\)"):
        assert_keep_no_tensors(*_probe_launches(launch))


def test_a_tensor_kept_where_no_walk_looks_is_found() -> None:
    def launch(inputs: Any, outputs: Any) -> None:
        if not _STASH:
            _STASH.append(outputs[0].new_zeros(4, dtype=torch.int32))
        _copy(inputs, outputs)

    held = r"tensors outlive the calls: .*Tensor\(4,\) torch.int32 held by \['list'\]"
    try:
        with pytest.raises(AssertionError, match=held):
            assert_keep_no_tensors(*_probe_launches(launch))
    finally:
        _STASH.clear()
