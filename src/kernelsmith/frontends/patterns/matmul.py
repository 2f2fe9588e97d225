"""Matrix products with a fused epilogue (``matmul``), as users write them.

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- the product: ``F.linear(x, w)`` and ``F.linear(x, w, b)`` (so ``nn.Linear``, whose forward is
  that call), ``x @ w.T``, ``torch.matmul(x, w.t())``, ``x.matmul(w.transpose(0, 1))`` (also
  ``w.mT``, ``w.permute(1, 0)``, ``w.swapaxes(0, 1)``), all layout ``"linear"`` with the weight
  ``w`` stored ``(N, K)``; and ``x @ w``, ``torch.matmul(x, w)``, ``torch.mm(x, w)``,
  ``F.linear(x, w.T)``, layout ``"matmul"`` with ``w`` stored ``(K, N)``. ``x`` is ``(..., K)``,
  the weight 2-D;
- then, in this order, a bias add (``+ b`` with ``b`` of shape ``(N,)`` or ``(1, ..., N)``, when
  ``F.linear`` had none) and one of: ``F.gelu`` (``approximate`` ``"none"`` or ``"tanh"``),
  ``F.silu`` / ``nn.SiLU`` / ``h * torch.sigmoid(h)``, or a residual add ``+ r`` with ``r``
  shaped like the output. The adds may be written either way round;
- the SwiGLU pair ``F.silu(x @ w1.T) * (x @ w3.T)`` (or with ``F.linear``, two bias-free
  ``nn.Linear``, ``h * sigmoid(h)`` for the SiLU, the factors in any order): one ``x``, two
  weights of one shape and layout. The gate ``w1`` is the weight of the activated product.

The match's constants are ``layout``, ``epilogue`` and ``bias``; ``allow_tf32`` is read from
PyTorch's current setting by :meth:`kernelsmith.ops.matmul.Matmul.spec_for` when a call binds.

Refused, with a reason: an activation followed by an add (``F.gelu(h) + r``: not one epilogue),
two biases, a bias or an addend of another shape (broadcast along rows), a bias on a SwiGLU
product, SwiGLU products of two different ``x`` or of weights of different shapes, a weight of
more or fewer than two dims (batched products), ``x`` or a weight computed in the function,
casts, mixed dtypes, and anything computed besides the op.

The operands and a transpose's dims are read from the call's recorded arguments (so
``F.linear(weight=w, input=x)`` and ``w.transpose(-1, -2)`` are what they say, and a no-op
``w.transpose(0, 0)`` is refused). A capture that records no arguments leaves the tensors in call
order and a transpose whose output is its input's shape reversed: on a square weight a no-op would
then look like a transpose, which ``@kernelsmith.optimize`` still catches, since it compares the
function's own output with the recognized op's before it ever uses a kernel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kernelsmith.frontends.capture import Const, Graph, Kind, Node, TensorValue, Value
from kernelsmith.frontends.recognize import (
    Match,
    NoMatch,
    describe,
    input_ref,
    product_factors,
    require_only,
    row_parameter_ref,
    single_tensor_output,
)

logger = logging.getLogger(__name__)

OP = "matmul"

_LINEAR = {"torch.nn.functional.linear"}
# torch.mm resolves to "torch.spmm" in some PyTorch versions (one builtin under two names).
_MATMUL = {"torch.matmul", "torch.Tensor.matmul", "torch.Tensor.__matmul__", "torch.mm", "torch.spmm",
           "torch.Tensor.mm"}  # fmt: skip
# Transposes of a 2-D tensor whatever its shape.
_TRANSPOSE_ALWAYS = {"torch.Tensor.T", "torch.Tensor.t", "torch.t", "torch.Tensor.mT", "torch.Tensor.H",
                     "torch.Tensor.mH", "torch.adjoint", "torch.Tensor.adjoint"}  # fmt: skip
# Transposes given dims the capture does not record: the shape must show the swap.
_TRANSPOSE_DIMS = {"torch.Tensor.transpose", "torch.transpose", "torch.Tensor.swapaxes", "torch.swapaxes",
                   "torch.Tensor.swapdims", "torch.swapdims", "torch.Tensor.permute", "torch.permute"}  # fmt: skip
_PRODUCTS = _LINEAR | _MATMUL


@dataclass
class _Product:
    """One recognized matrix product: ``x`` times ``weight`` in ``layout``, perhaps with
    F.linear's own bias; ``nodes`` are the graph nodes it covers."""

    x: TensorValue
    weight: TensorValue
    layout: str
    bias: TensorValue | None
    out: TensorValue
    nodes: list[Node] = field(default_factory=list)


def match(graph: Graph) -> Match | None:
    """The ``matmul`` match of ``graph``; None when it computes no matrix product at all."""
    if not any(n.kind is Kind.OTHER and n.name in _PRODUCTS for n in graph.nodes):
        return None
    out = single_tensor_output(graph)
    swiglu = _swiglu(graph, out)
    if swiglu is not None:
        return swiglu
    return _with_epilogue(graph, out)


# ---- the product -------------------------------------------------------------------------------


def _product(graph: Graph, value: Value) -> _Product | None:
    """The product that made ``value``, or None when a product node did not make it."""
    node = graph.producer(value)
    if node is None or node.kind is not Kind.OTHER or node.name not in _PRODUCTS:
        return None
    if node.name in _LINEAR:
        x, w_value, bias = _operands(node, ("input", "weight", "bias"), {})
        plain_layout = "linear"
    else:
        x, w_value, bias = _operands(node, ("input", "other"), {"self": "input", "mat2": "other"})
        plain_layout = "matmul"
    nodes = [node]
    transpose = _transpose(graph, w_value)
    if transpose is not None:
        nodes.append(transpose)
        w_value = transpose.inputs[0]
        layout = "matmul" if plain_layout == "linear" else "linear"
    else:
        layout = plain_layout
        other = graph.producer(w_value)
        if other is not None and other.name in _TRANSPOSE_ALWAYS | _TRANSPOSE_DIMS:
            raise NoMatch(f"the weight is {other.name} of {describe(graph, other.inputs[0])}: the op takes a 2-D "
                          "weight, transposed whole (no batched product)")  # fmt: skip
    x_value, weight = _input(graph, x, "x"), _input(graph, w_value, "weight")
    if weight.ndim != 2:
        raise NoMatch(f"the weight is {weight.ndim}-D ({weight.shape}): the op takes a 2-D weight, no batched product")
    if x_value.ndim < 1:
        raise NoMatch("x is 0-d")
    bias_value = _input(graph, bias, "bias") if bias is not None else None
    assert isinstance(node.out, TensorValue)
    return _Product(x_value, weight, layout, bias_value, node.out, nodes)


def _arguments(node: Node, names: tuple[str, ...], aliases: dict[str, str]) -> dict[str, Value] | None:
    """An opaque call's recorded arguments bound to ``names`` (keywords renamed by ``aliases``);
    None when the capture recorded no arguments (then only the tensors, in order, are known)."""
    args, kwargs = node.params.get("args"), node.params.get("kwargs")
    if args is None or kwargs is None:
        return None
    if len(args) > len(names):
        raise NoMatch(f"{node.name} with {len(args)} arguments")
    bound = dict(zip(names, args, strict=False))
    for key, v in kwargs.items():
        name = aliases.get(key, key)
        if name in bound or name not in names:
            raise NoMatch(f"{node.name} with the argument {key!r}")
        bound[name] = v
    return bound


def _operands(node: Node, names: tuple[str, ...], aliases: dict[str, str]) -> tuple[Value, Value, Value | None]:
    """(x, weight, F.linear's bias or None) of a product node."""
    bound = _arguments(node, names, aliases)
    if bound is None:  # the tensors in call order
        inputs = node.inputs
        if len(inputs) not in ((2, 3) if len(names) == 3 else (2,)):
            raise NoMatch(f"{node.name} with {len(inputs)} tensors")
        return inputs[0], inputs[1], inputs[2] if len(inputs) == 3 else None
    if names[0] not in bound or names[1] not in bound:
        raise NoMatch(f"{node.name} without its two operands")
    bias = bound.get("bias")
    if isinstance(bias, Const) and bias.value is None:
        bias = None
    return bound[names[0]], bound[names[1]], bias


def _transpose(graph: Graph, value: Value) -> Node | None:
    """The node when ``value`` is a transpose of a 2-D tensor, else None."""
    node = graph.producer(value)
    if node is None or node.kind is not Kind.OTHER or len(node.inputs) != 1:
        return None
    source = node.inputs[0]
    if not isinstance(source, TensorValue) or not isinstance(value, TensorValue) or source.ndim != 2:
        return None
    if node.name in _TRANSPOSE_ALWAYS:
        return node
    if node.name not in _TRANSPOSE_DIMS:
        return None
    swaps = _swaps_the_dims(node)
    if swaps is False:
        raise NoMatch(f"{node.name} with these dims does not transpose the 2-D weight")
    if swaps is None and value.shape != source.shape[::-1]:  # dims not recorded: the shape must show it
        return None
    return node


def _swaps_the_dims(node: Node) -> bool | None:
    """Whether a transpose / swapaxes / permute of a 2-D tensor swaps its two dims, by its recorded
    dims; None when the capture recorded no arguments."""
    args, kwargs = node.params.get("args"), node.params.get("kwargs")
    if args is None or kwargs is None:
        return None
    positional = list(args[1:]) if args and isinstance(args[0], TensorValue) else list(args)
    given = positional + [v for k, v in kwargs.items() if k not in ("input", "self")]
    dims = [d.value if isinstance(d, Const) else None for d in given]
    if len(dims) == 1 and isinstance(dims[0], tuple | list):  # permute((1, 0)), permute(dims=...)
        dims = list(dims[0])
    ints = [d for d in dims if isinstance(d, int) and not isinstance(d, bool) and -2 <= d < 2]
    if len(ints) != 2 or len(dims) != 2:
        return False
    first, second = (d % 2 for d in ints)
    if node.name.endswith("permute"):
        return (first, second) == (1, 0)
    return first != second  # transpose(d0, d1): symmetric


def _input(graph: Graph, value: Value | None, role: str) -> TensorValue:
    """An op input: a tensor from outside the function, not computed in it."""
    node = graph.producer(value)
    if node is not None:
        raise NoMatch(f"the {role} is computed by {node.name}, not an input tensor")
    if not isinstance(value, TensorValue):
        raise NoMatch(f"the {role} is {describe(graph, value)}, not a tensor")
    return value


# ---- SwiGLU ------------------------------------------------------------------------------------


def _silu_of(graph: Graph, value: Value, factors: list[Value]) -> tuple[Value, list[Node]] | None:
    """``(h, nodes)`` when ``value`` is ``F.silu(h)``, or a ``sigmoid(h)`` whose ``h`` is among
    ``factors`` (the ``h * sigmoid(h)`` form)."""
    silu = graph.produced_by(value, Kind.SILU)
    if silu is not None:
        return silu.inputs[0], [silu]
    sigmoid = graph.produced_by(value, Kind.SIGMOID)
    if sigmoid is not None and any(f is sigmoid.inputs[0] for f in factors):
        return sigmoid.inputs[0], [sigmoid]
    return None


def _swiglu(graph: Graph, out: TensorValue) -> Match | None:
    """The match when ``out`` is ``silu(x @ w1.T) * (x @ w3.T)``; None when it is no product of
    two matrix products."""
    if graph.produced_by(out, Kind.MUL) is None:
        return None
    muls: list[Node] = []
    casts: list[tuple[Node, list[Value]]] = []
    factors = product_factors(graph, out, muls, casts)
    products = [f for f in factors if _product(graph, f) is not None]
    gates = [g for f in factors if (g := _silu_of(graph, f, factors)) is not None and _product(graph, g[0])]
    if len({id(p) for p in products} | {id(h) for h, _ in gates}) < 2:
        return None  # one product (h * sigmoid(h) is the silu epilogue, not SwiGLU)
    if casts:
        raise NoMatch(f"casts ({', '.join(c.name for c, _ in casts)}) around the SwiGLU product")
    if len(gates) != 1:
        raise NoMatch(f"multiplies {len(gates)} SiLU-activated products, not one gate")
    gate_value, act_nodes = gates[0]
    used_factors = [f for f in factors if f is not gate_value and graph.producer(f) not in act_nodes]
    if len(used_factors) != 1:
        raise NoMatch(f"multiplies the gate by {[describe(graph, f) for f in used_factors]}, not by one product")
    gate = _product(graph, gate_value)
    up = _product(graph, used_factors[0])
    if gate is None or up is None:
        raise NoMatch("the gate and the up projection must both be matrix products of x")
    if gate.x is not up.x:
        raise NoMatch("the gate and the up projection multiply two different x")
    if gate.bias is not None or up.bias is not None:
        raise NoMatch("the SwiGLU products have a bias (the fused SwiGLU takes none)")
    if gate.layout != up.layout or gate.weight.shape != up.weight.shape:
        raise NoMatch(f"the weights differ in layout or shape ({gate.weight.shape} {gate.layout}, "
                      f"{up.weight.shape} {up.layout})")  # fmt: skip
    if gate.weight is up.weight:
        logger.debug("SwiGLU with one weight for the gate and the up projection")
    _check_dtypes(out, [gate.x, gate.weight, up.weight])
    refs = (input_ref(gate.x, "x"), input_ref(gate.weight, "gate weight w1"), input_ref(up.weight, "up weight w3"))
    require_only(graph, [*muls, *act_nodes, *gate.nodes, *up.nodes], OP)
    return Match(OP, refs, {"layout": gate.layout, "epilogue": "swiglu", "bias": False})


# ---- one product and its epilogue --------------------------------------------------------------


def _addend(graph: Graph, node: Node, chain: Value) -> TensorValue | None:
    """The input-tensor operand of an ADD node whose other operand is ``chain``."""
    a, b = node.inputs
    other = b if a is chain else a
    if graph.producer(other) is not None or not isinstance(other, TensorValue):
        return None
    return other


def _peel_adds(graph: Graph, value: Value) -> tuple[Value, list[tuple[Node, TensorValue]]]:
    """Walk down ADD nodes that add an input tensor to a computed value: (the computed value
    under them, [(add node, added tensor), ...] from the top)."""
    adds: list[tuple[Node, TensorValue]] = []
    while True:
        node = graph.produced_by(value, Kind.ADD)
        if node is None:
            return value, adds
        a, b = node.inputs
        computed = [v for v in (a, b) if graph.producer(v) is not None]
        if len(computed) != 1:
            return value, adds
        added = _addend(graph, node, computed[0])
        if added is None:
            return value, adds
        adds.append((node, added))
        value = computed[0]


def _activation(graph: Graph, value: Value) -> tuple[str, Value, list[Node]] | None:
    """``(epilogue, h, nodes)`` when ``value`` is ``gelu(h)``, ``silu(h)`` or ``h * sigmoid(h)``."""
    gelu = graph.produced_by(value, Kind.GELU)
    if gelu is not None:
        approximate = gelu.params["approximate"]
        if approximate not in ("none", "tanh"):
            raise NoMatch(f"approximate={approximate!r} is neither 'none' nor 'tanh'")
        return ("gelu" if approximate == "none" else "gelu_tanh"), gelu.inputs[0], [gelu]
    silu = graph.produced_by(value, Kind.SILU)
    if silu is not None:
        return "silu", silu.inputs[0], [silu]
    mul = graph.produced_by(value, Kind.MUL)
    if mul is not None:
        a, b = mul.inputs
        for h, s in ((a, b), (b, a)):
            sigmoid = graph.produced_by(s, Kind.SIGMOID)
            if sigmoid is not None and sigmoid.inputs[0] is h:
                return "silu", h, [mul, sigmoid]
    return None


def _with_epilogue(graph: Graph, out: TensorValue) -> Match:
    """The match of one product followed by a bias, an activation or a residual add."""
    value, outer = _peel_adds(graph, out)
    epilogue = "none"
    used: list[Node] = [n for n, _ in outer]
    activation = _activation(graph, value)
    if activation is not None:
        if outer:
            raise NoMatch(f"adds {describe(graph, outer[0][1])} after the activation: not one epilogue "
                          "(an activation or a residual add, not both)")  # fmt: skip
        epilogue, value, nodes = activation
        used += nodes
        value, inner = _peel_adds(graph, value)
        used += [n for n, _ in inner]
    else:
        inner = outer
    product = _product(graph, value)
    if product is None:
        if activation is None and not inner:
            raise NoMatch(f"the output comes from {describe(graph, value)}: not a matrix product or an epilogue "
                          "(bias, gelu, silu, residual add, swiglu) of one")  # fmt: skip
        raise NoMatch(f"the epilogue is applied to {describe(graph, value)}, not to a matrix product")
    used += product.nodes

    bias: TensorValue | None = product.bias
    if bias is not None and not _is_row_vector(bias, out):
        raise NoMatch(f"the bias has shape {bias.shape}: not (N,) = ({out.shape[-1]},)")
    bias_ref = input_ref(bias, "bias") if bias is not None else None
    residual: TensorValue | None = None
    for _, added in reversed(inner):  # from the product up
        # A 2-D or larger addend shaped like the output is a residual; a row vector is the bias
        # (for a 1-D output, the first add is the bias and a second the residual).
        like_output = added.shape == out.shape and (out.ndim >= 2 or bias is not None)
        if like_output and activation is None and residual is None:
            residual = added
        elif bias is None and _is_row_vector(added, out):
            bias, bias_ref = added, row_parameter_ref(added, out, "bias")
        else:
            raise NoMatch(
                f"adds {describe(graph, added)}: neither the bias (N,) nor a residual shaped like the "
                f"output {out.shape} (at most one of each, the residual only without an activation)"
            )
    if residual is not None:
        epilogue = "residual"

    n = out.shape[-1]
    k = product.x.shape[-1]
    expected_w = (n, k) if product.layout == "linear" else (k, n)
    if product.weight.shape != expected_w:
        raise NoMatch(f"the weight {product.weight.shape} does not give the output's {n} columns from x's {k}")
    if out.shape != (*product.x.shape[:-1], n):
        raise NoMatch(f"the output has shape {out.shape}, not x's leading dims and N ({product.x.shape}, N={n})")
    _check_dtypes(out, [product.x, product.weight, *([bias] if bias is not None else []), *(a for _, a in inner)])
    refs = [input_ref(product.x, "x"), input_ref(product.weight, "weight")]
    if bias_ref is not None:
        refs.append(bias_ref)
    if residual is not None:
        refs.append(input_ref(residual, "residual"))
    require_only(graph, used, OP)
    constants = {"layout": product.layout, "epilogue": epilogue, "bias": bias_ref is not None}
    return Match(OP, tuple(refs), constants)


def _is_row_vector(t: TensorValue, out: TensorValue) -> bool:
    """Whether ``t`` adds one value per output column: (N,) or (1, ..., 1, N), no more dims than
    the output."""
    return t.ndim >= 1 and t.shape[-1] == out.shape[-1] and all(s == 1 for s in t.shape[:-1]) and t.ndim <= out.ndim


def _check_dtypes(out: TensorValue, tensors: list[TensorValue]) -> None:
    for t in tensors:
        if t.dtype != out.dtype:
            raise NoMatch(f"{t.describe()} is {t.dtype}, but the output is {out.dtype} (mixed dtypes or casts)")
