"""Functional networks parametrised by one flat weight vector.

Every model in the library stores all network weights in one latent site ``"w"`` whose event
shape is ``(P,)``. A :class:`FlatNet` maps such a vector (or a batch of them) to the network
function ``f(x; w)``:

``w`` of shape ``(*B, P)`` and ``x`` of shape ``(N, D)`` or ``(*B, N, D)`` (broadcastable) give
``f`` of shape ``(*B, N, out_features)`` in one batched computation. Two implementations:
:class:`MLP`, written on slices of the flat vector, and :class:`ModuleNet`, any
``torch.nn.Module`` through ``torch.func.functional_call`` and ``torch.vmap``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from ._checks import ArgumentTypeError
from ._mlp_kernels import ACTIVATION_TABLE, ACTIVATIONS, Activation, affine, get_activation, mlp_hidden
from ._mlp_kernels import unflatten as _unflatten

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "MLP_ACTIVATION_MODULES",
    "FlatNet",
    "ModuleNet",
    "as_hidden_sizes",
    "as_positive_int",
    "equivalent_mlp",
    "mlp_call",
    "mlp_mismatch",
]


def as_positive_int(value: object, name: str, role: str = "") -> int:
    """``value`` as an ``int >= 1``: Python or numpy integers, integral floats (``4.0``) and
    one-element tensors are accepted; a fraction (``4.7``, never truncated), a bool or anything
    else raises a ``ValueError`` naming ``name`` (``role`` adds what the number is for;
    :class:`~pyro_bnnlv._checks.ArgumentTypeError`, also a ``TypeError``, for a non-number)."""
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if isinstance(value, numbers.Integral) or float(value).is_integer():
            if value >= 1:
                return int(value)
        raise ValueError(f"{name} must be a positive integer{role}, got {value!r}")
    kind = ValueError if isinstance(value, bool) else ArgumentTypeError
    raise kind(f"{name} must be a positive integer{role}, got {value!r}")


def as_hidden_sizes(value: object, name: str = "hidden_sizes") -> tuple:
    """``hidden_sizes`` as a tuple: one width (an integer) or a sequence of widths; ``None``, a
    set or a dict is refused naming ``name`` (a string's characters are refused one by
    one as widths, so ``'44'`` is never read as ``[4, 4]``)."""
    if isinstance(value, (numbers.Number, Tensor)) and not isinstance(value, bool):
        if isinstance(value, Tensor) and value.dim() > 0:
            return tuple(value.tolist())
        return (value,)
    if isinstance(value, (set, frozenset, Mapping)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(
            f"{name} must be a sequence of layer widths (e.g. [50], or [] for a linear model), got {value!r}"
        )
    return tuple(value)


class FlatNet(nn.Module):
    """A network ``f(x; w)`` whose weights are one flat vector ``w`` of length :attr:`num_weights`.

    Subclasses implement :meth:`forward` for ``w`` of shape ``(*B, P)`` and
    :meth:`init_weights`. A ``FlatNet`` has no trainable parameters of its own: the weights are
    an input, so the same object serves a posterior sample, a MAP vector or a batch of samples.
    """

    in_features: int
    out_features: int
    num_weights: int

    def forward(self, x: Tensor, w: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def init_weights(self, generator: torch.Generator | None = None) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def values_per_point(self) -> int:
        """The most numbers one weight sample's forward holds per input point at once (its widest
        layer), for sizing :meth:`forward_in_blocks`; here the inputs or the outputs."""
        return max(self.in_features, self.out_features)

    def forward_in_blocks(self, x: Tensor, w: Tensor, max_values: int = 2**18) -> Tensor:
        """``self(x, w)`` for ``w (S, P)`` and ``x (N, D)`` or ``(S, N, D)``, evaluated over blocks
        of the ``S`` weight samples whose widest layer holds at most about ``max_values`` numbers
        (1 MiB in float32: a predictive over many samples and points is bound by memory traffic,
        and a block's activations then stay in the CPU's cache). Every sample's function is
        computed alone, so the values are those of ``self(x, w)``."""
        S = w.shape[0]
        block = max(1, max_values // max(1, x.shape[-2] * self.values_per_point()))
        if w.dim() != 2 or block >= S:
            return self(x, w)
        batched = x.dim() == 3
        return torch.cat([self(x[i : i + block] if batched else x, w[i : i + block]) for i in range(0, S, block)])

    def check_input(self, x: Tensor, name: str = "x") -> None:
        """Raise ``ValueError`` unless ``x`` is a finite ``(..., N, in_features)`` tensor."""
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 2:
            raise ValueError(f"{name} must have shape (N, {self.in_features}); got shape {tuple(x.shape)}")
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"{name} has {x.shape[-1]} columns but the network expects "
                f"in_features={self.in_features} (shape {tuple(x.shape)})"
            )
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} contains NaN or infinite values")

    def check_call(self, x: Tensor, w: Tensor) -> None:
        """What ``f(x; w)`` needs besides ``w``'s length (:meth:`check_weights`): ``x``'s last
        dimension ``in_features`` and one floating dtype for ``x`` and ``w``; a ``ValueError``
        naming both otherwise (skipped under the JIT, where the checks would be frozen)."""
        if torch.jit.is_tracing() or not isinstance(x, Tensor) or not isinstance(w, Tensor):
            return
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"x has {x.shape[-1] if x.dim() else 0} columns (shape {tuple(x.shape)}) but the "
                f"network expects in_features={self.in_features}: pass x of shape (N, {self.in_features})"
            )
        if x.dtype != w.dtype:
            fix = {torch.float32: "float()", torch.float64: "double()"}
            hint = (
                f"convert one of them, e.g. x.{fix[w.dtype]} or w.{fix[x.dtype]}"
                if x.dtype in fix and w.dtype in fix
                else f"both must be floating point of one dtype, e.g. x.to({w.dtype})"
            )
            raise ValueError(f"x has dtype {x.dtype} but w has dtype {w.dtype}: {hint}")

    def check_weights(self, w: Tensor, name: str = "w") -> None:
        if not torch.jit.is_tracing() and w.shape[-1:] != (self.num_weights,):
            raise ValueError(
                f"{name} must have last dimension num_weights={self.num_weights}; got shape {tuple(w.shape)}"
            )


class MLP(FlatNet):
    """Fully connected network ``D -> hidden_sizes -> out`` on a flat weight vector.

    Layout of ``w``: for each layer in order, the weight matrix ``(fan_out, fan_in)`` row-major,
    then the bias ``(fan_out,)``, the same order as ``torch.nn.Linear``'s parameters, so
    ``MLP(...).unflatten(w)`` can be loaded into an equivalent ``nn.Sequential``.

    Args:
        in_features: input width ``D``.
        hidden_sizes: widths of the hidden layers (may be empty: a linear model).
        out_features: output width ``L``.
        activation: one of ``tanh``, ``relu``, ``leaky_relu`` (slope 0.01), ``rbf``
            (``exp(-a^2)``), ``sigmoid``, ``silu`` (``a sigmoid(a)``, ``nn.SiLU``), ``gelu`` (exact,
            ``a Phi(a)``, ``nn.GELU()``), ``softplus`` (``nn.Softplus()``: ``beta=1``, ``threshold=20``)
            or ``identity``: the rows of :data:`~pyro_bnnlv._mlp_kernels.ACTIVATION_TABLE` (add one
            there). Every one has the compiled NUTS potential.
    """

    def __init__(
        self, in_features: int, hidden_sizes: Sequence[int] = (50,), out_features: int = 1, activation: str = "tanh"
    ) -> None:
        super().__init__()
        hidden_sizes = as_hidden_sizes(hidden_sizes)
        sizes = [
            as_positive_int(in_features, "in_features", " (a layer width)"),
            *(as_positive_int(h, f"hidden_sizes[{i}]", " (a layer width)") for i, h in enumerate(hidden_sizes)),
            as_positive_int(out_features, "out_features", " (a layer width)"),
        ]
        act = get_activation(activation)  # ValueError naming the choices
        self.in_features, self.out_features = sizes[0], sizes[-1]
        self.hidden_sizes = tuple(sizes[1:-1])
        self.activation = act.name
        # (fan_in, fan_out, weight slice, bias slice) per layer
        self.layers: list[tuple[int, int, slice, slice]] = []
        offset = 0
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            w_sl = slice(offset, offset + fan_in * fan_out)
            offset += fan_in * fan_out
            b_sl = slice(offset, offset + fan_out)
            offset += fan_out
            self.layers.append((fan_in, fan_out, w_sl, b_sl))
        self.num_weights = offset

    def config(self) -> dict:
        """Constructor arguments, so the network can be rebuilt (``MLP(**net.config())``)."""
        return dict(
            in_features=self.in_features,
            hidden_sizes=list(self.hidden_sizes),
            out_features=self.out_features,
            activation=self.activation,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_features} -> {list(self.hidden_sizes)} -> {self.out_features}, "
            f"activation={self.activation}, num_weights={self.num_weights}"
        )

    def values_per_point(self) -> int:
        """The widest layer (inputs, hidden or outputs)."""
        return max(self.in_features, *self.hidden_sizes, self.out_features)

    def unflatten(self, w: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Split ``w`` of shape ``(*B, P)`` into ``[(W_l (*B, fan_out, fan_in), b_l (*B, fan_out))]``."""
        self.check_weights(w)
        return _unflatten(self.layers, w)

    def layer_fan_in(self) -> Tensor:
        """Per-weight fan-in ``H`` (biases get 0), for the ``N(0, omega^2 / H)`` prior."""
        fan = torch.zeros(self.num_weights)
        for fan_in, _, w_sl, _ in self.layers:
            fan[w_sl] = fan_in
        return fan

    def bias_mask(self) -> Tensor:
        """Boolean mask of the bias entries of ``w``."""
        mask = torch.zeros(self.num_weights, dtype=torch.bool)
        for _, _, _, b_sl in self.layers:
            mask[b_sl] = True
        return mask

    def init_weights(self, generator: torch.Generator | None = None) -> Tensor:
        """A weight vector drawn like PyTorch's ``nn.Linear`` default: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
        w = torch.empty(self.num_weights)
        for fan_in, _, w_sl, b_sl in self.layers:
            bound = 1.0 / math.sqrt(fan_in)
            w[w_sl] = torch.rand(w_sl.stop - w_sl.start, generator=generator) * 2 * bound - bound
            w[b_sl] = torch.rand(b_sl.stop - b_sl.start, generator=generator) * 2 * bound - bound
        return w

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        """``f(x; w)``: ``x (N, D)`` or ``(*B, N, D)``, ``w (P,)`` or ``(*B, P)`` -> ``(*B, N, L)``."""
        self.check_call(x, w)
        params = self.unflatten(w)
        W, b = params[-1]
        return affine(self._hidden(x, params[:-1]), W, b)

    def hidden(self, x: Tensor, w: Tensor, num_layers: int) -> Tensor:
        """The activations ``z_l`` after the first ``num_layers`` (hidden) layers, shapes as in
        :meth:`forward` with ``L`` the width of layer ``num_layers``; ``num_layers = 0`` gives ``x``."""
        if not 0 <= num_layers < len(self.layers):
            raise ValueError(
                f"num_layers must lie in [0, {len(self.layers) - 1}] (the hidden layers), got {num_layers!r}"
            )
        self.check_call(x, w)
        return self._hidden(x, self.unflatten(w)[:num_layers])

    @property
    def activation_row(self) -> Activation:
        """The :data:`~pyro_bnnlv._mlp_kernels.ACTIVATION_TABLE` row of :attr:`activation`
        (value, hand-written derivative, C++ code), for the kernels of :mod:`pyro_bnnlv._mlp_kernels`."""
        return ACTIVATION_TABLE[self.activation]

    def _hidden(self, h: Tensor, params: list[tuple[Tensor, Tensor]]) -> Tensor:
        return mlp_hidden(h, params, self.activation_row)


class ModuleNet(FlatNet):
    """Adapter: any ``torch.nn.Module`` as a :class:`FlatNet`.

    The module's parameters (in ``named_parameters()`` order) are concatenated into the flat
    vector (:meth:`param_slices` says where each one lives). ``forward`` evaluates the module with
    ``torch.func.functional_call``, vectorised over the weight samples with ``torch.vmap``. The
    module must map ``(N, in_features)`` to ``(N, out_features)``; its own parameter values serve
    as :meth:`init_weights`.

    Example::

        net = pb.ModuleNet(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1)), 6, 1)
        model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net), noise_scale=0.3)

    What to expect compared with :class:`MLP` (same function, same guides and ELBOs):

    * :func:`~pyro_bnnlv.models.bnn.fan_in_prior_scale` reads the fan-ins from the module's
      ``nn.Linear`` and ``nn.Conv*`` layers (:meth:`layer_fan_in`); other parameters (norm
      layers, embeddings) have no fan-in and need a ``prior_scale`` of your own.
    * ``fit_svi`` trains a model on a ``ModuleNet`` with the eager ``Trace_ELBO`` by default (its
      ``vmap(functional_call)`` cannot be traced by the JIT), quietly: the same estimator, at a
      higher cost per step than the compiled loss an ``MLP`` gets.
    * NUTS: a plain ``nn.Sequential`` of biased ``nn.Linear`` layers and one activation of
      :class:`MLP`'s (:func:`equivalent_mlp`) gets the compiled potential of that :class:`MLP` on
      the same weight vector. Any other module's potential has autograd gradients
      (``FlatPotential.from_log_density``; ``run_nuts`` warns once): each leapfrog step is a
      forward and backward pass through ``functional_call``, several times the hand-written
      potential's cost, and NUTS's trees often take hundreds of steps per draw.
    * Saving with :func:`~pyro_bnnlv.serialization.save_fit` needs an :class:`MLP`.
    """

    def __init__(self, module: nn.Module, in_features: int, out_features: int) -> None:
        super().__init__()
        self.module = module
        self.in_features, self.out_features = int(in_features), int(out_features)
        self._names = [n for n, _ in module.named_parameters()]
        self._shapes = [p.shape for _, p in module.named_parameters()]
        self._sizes = [p.numel() for _, p in module.named_parameters()]
        self.num_weights = sum(self._sizes)
        if self.num_weights == 0:
            raise ValueError("module has no parameters")
        for p in module.parameters():
            p.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> "ModuleNet":
        """A ``ModuleNet`` (and the module it wraps) always stays in eval mode: its weights come
        from ``w``, and Pyro's ``pyro.module`` would otherwise warn about every frozen parameter."""
        return super().train(False)

    def param_slices(self) -> dict[str, slice]:
        """``{parameter name: slice of w}``, in the flat vector's order."""
        out, offset = {}, 0
        for name, size in zip(self._names, self._sizes):
            out[name] = slice(offset, offset + size)
            offset += size
        return out

    def _layer_roles(self) -> dict[str, tuple[str, int]]:
        """``{parameter name: ("weight", fan_in) | ("bias", 0)}`` for the parameters of the
        module's ``nn.Linear`` and ``nn.Conv*`` layers (fan-in: inputs per output unit,
        ``in_features`` resp. ``in_channels / groups * prod(kernel_size)``)."""
        roles: dict[str, tuple[str, int]] = {}
        for prefix, sub in self.module.named_modules():
            if not isinstance(sub, (nn.Linear, nn.modules.conv._ConvNd)):
                continue
            dot = f"{prefix}." if prefix else ""
            if sub.weight is not None:
                roles[dot + "weight"] = ("weight", int(sub.weight[0].numel()))
            if getattr(sub, "bias", None) is not None:
                roles[dot + "bias"] = ("bias", 0)
        return roles

    def _checked_roles(self) -> dict[str, tuple[str, int]]:
        roles = self._layer_roles()
        unknown = [n for n in self._names if n not in roles]
        if unknown:
            raise ValueError(
                f"ModuleNet: the fan-in is known for nn.Linear and nn.Conv* layers only; parameters "
                f"{unknown} belong to other layers. Pass prior_scale as a ({self.num_weights},) "
                f"tensor of your own (ModuleNet.param_slices() gives each parameter's slice of w)"
            )
        return roles

    def layer_fan_in(self) -> Tensor:
        """Per-weight fan-in ``H`` (biases get 0), as :meth:`MLP.layer_fan_in`; ``ValueError``
        naming the parameters outside ``nn.Linear`` / ``nn.Conv*`` layers."""
        roles = self._checked_roles()
        fan = torch.zeros(self.num_weights)
        for name, sl in self.param_slices().items():
            fan[sl] = float(roles[name][1])
        return fan

    def bias_mask(self) -> Tensor:
        """Boolean mask of the bias entries of ``w`` (``nn.Linear`` / ``nn.Conv*`` biases)."""
        roles = self._checked_roles()
        mask = torch.zeros(self.num_weights, dtype=torch.bool)
        for name, sl in self.param_slices().items():
            mask[sl] = roles[name][0] == "bias"
        return mask

    def unflatten(self, w: Tensor) -> dict[str, Tensor]:
        """``w (P,)`` -> ``{parameter name: tensor}`` for ``functional_call``."""
        self.check_weights(w)
        return {n: t.reshape(s) for n, t, s in zip(self._names, w.split(self._sizes, -1), self._shapes)}

    def init_weights(self, generator: torch.Generator | None = None) -> Tensor:
        """The module's current parameters as a flat vector (re-initialise the module to vary it)."""
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()])

    def _single(self, x: Tensor, w: Tensor) -> Tensor:
        return torch.func.functional_call(self.module, self.unflatten(w), (x,))

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        self.check_weights(w)
        self.check_call(x, w)
        batch = w.shape[:-1]
        if not batch:
            return self._single(x, w)
        x_b = torch.broadcast_to(x, (*batch, *x.shape[-2:]))
        out = torch.vmap(self._single)(x_b.reshape(-1, *x.shape[-2:]), w.reshape(-1, w.shape[-1]))
        return out.reshape(*batch, *out.shape[-2:])


# -- nn.Sequential -> MLP ----------------------------------------------------------------------
#: the activation modules :func:`equivalent_mlp` recognises, as messages name them
MLP_ACTIVATION_MODULES = "nn.Tanh, nn.ReLU, nn.LeakyReLU(), nn.Sigmoid, nn.SiLU, nn.GELU(), nn.Softplus()"


def _activation_name(layer: nn.Module) -> str | None:
    """The :data:`~pyro_bnnlv._mlp_kernels.ACTIVATION_TABLE` name computing ``layer`` exactly, or
    ``None``: only torch's own classes (not subclasses) with the table's parameters."""
    kind = type(layer)
    if kind is nn.LeakyReLU:
        return "leaky_relu" if layer.negative_slope == 0.01 else None
    if kind is nn.GELU:
        return "gelu" if layer.approximate == "none" else None
    if kind is nn.Softplus:
        return "softplus" if layer.beta == 1 and layer.threshold == 20 else None
    return {nn.Tanh: "tanh", nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.SiLU: "silu", nn.Identity: "identity"}.get(kind)


def _has_hooks(layer: nn.Module) -> bool:
    return any(
        getattr(layer, k, None)
        for k in (
            "_forward_hooks",
            "_forward_pre_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
            "_forward_hooks_with_kwargs",
        )
    )


def mlp_mismatch(module: nn.Module) -> tuple[MLP | None, str]:
    """``(mlp, "")`` when ``module`` computes :class:`MLP` ``mlp`` on the same flat weight vector,
    else ``(None, reason)``. See :func:`equivalent_mlp`."""
    if type(module) is not nn.Sequential:
        return None, f"the module is a {type(module).__name__}, not an nn.Sequential"
    layers = list(module)
    if not layers or type(layers[0]) is not nn.Linear or type(layers[-1]) is not nn.Linear:
        return None, "the nn.Sequential does not start and end with an nn.Linear"
    if any(isinstance(sub, nn.Sequential) for sub in layers):
        return None, "the nn.Sequential is nested"
    if (
        _has_hooks(module)
        or any(_has_hooks(sub) for sub in layers)
        or any(getattr(nn.modules.module, k, None) for k in ("_global_forward_hooks", "_global_forward_pre_hooks"))
    ):
        return None, "forward hooks are registered"
    sizes, acts, expect = [layers[0].in_features], set(), []
    for i, layer in enumerate(layers):
        if type(layer) is nn.Linear:
            if i > 0 and type(layers[i - 1]) is nn.Linear:
                return None, f"layers {i - 1} and {i} are two nn.Linear in a row (no activation between them)"
            if layer.bias is None:
                return None, f"layer {i} is an nn.Linear without bias (an MLP layer has one)"
            if layer.in_features != sizes[-1]:
                return None, f"layer {i}'s in_features {layer.in_features} differ from the width {sizes[-1]} before it"
            sizes.append(layer.out_features)
            expect += [f"{i}.weight", f"{i}.bias"]
            continue
        name = _activation_name(layer)
        if name is None:
            return None, (f"layer {i} ({layer!r}) is not an activation of pb.MLP's ({MLP_ACTIVATION_MODULES})")
        if type(layers[i - 1]) is not nn.Linear:
            return None, f"layer {i} is a second activation in a row"
        acts.add(name)
    if len(acts) > 1:
        return None, f"it mixes activations {sorted(acts)} (pb.MLP has one)"
    names = [n for n, _ in module.named_parameters()]
    if names != expect or list(module.buffers()):
        return None, "its parameters are not those of its nn.Linear layers (parametrizations or buffers)"
    act = acts.pop() if acts else "identity"
    return MLP(sizes[0], sizes[1:-1], sizes[-1], activation=act), ""


def equivalent_mlp(module: nn.Module | ModuleNet) -> MLP | None:
    r"""The :class:`MLP` that computes ``module`` (or a :class:`ModuleNet`'s module) on the same
    flat weight vector, or ``None``.

    An ``nn.Sequential`` ``Linear(D, H_1), act, Linear(H_1, H_2), act, ..., Linear(H_k, L)``, with
    every ``nn.Linear`` biased and one activation throughout, is ``MLP(D, [H_1, .., H_k], L,
    activation=act)``, weight for weight (:class:`ModuleNet`'s ``named_parameters()`` order is
    :class:`MLP`'s layout). The activations recognised are torch's own classes computing a
    table row exactly: ``nn.Tanh``, ``nn.ReLU``, ``nn.LeakyReLU(0.01)`` (torch's default slope),
    ``nn.Sigmoid``, ``nn.SiLU``, ``nn.GELU(approximate="none")``, ``nn.Softplus(beta=1,
    threshold=20)`` (the defaults) and ``nn.Identity``. Anything else (subclasses, other
    parameters, forward hooks, a nested ``nn.Sequential``, ``nn.Linear(bias=False)``) gives
    ``None``; :func:`mlp_mismatch` says why. With a :class:`ModuleNet` its in/out widths must match.
    """
    net = module if isinstance(module, ModuleNet) else None
    mlp, _ = mlp_mismatch(net.module if net is not None else module)
    if mlp is None or net is None:
        return mlp
    same = (mlp.in_features, mlp.out_features, mlp.num_weights) == (net.in_features, net.out_features, net.num_weights)
    return mlp if same else None


def mlp_call(net: MLP) -> str:
    """``net`` as the call that builds it: ``pb.MLP(6, [32, 32], 1, activation="silu")``."""
    return f'pb.MLP({net.in_features}, {list(net.hidden_sizes)}, {net.out_features}, activation="{net.activation}")'
