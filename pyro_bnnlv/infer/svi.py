"""Fitting loops: stochastic variational inference and MAP / maximum-likelihood training.

``fit_svi`` runs the loop of ``pyro.infer.SVI.step`` with one ``torch.optim.Adam`` step over all
parameters per ``loss.loss_and_grads(...)`` call: Adam is elementwise, so this is Pyro's
per-parameter ``pyro.optim.Adam`` update (to float rounding) without SVI's per-step parameter
trace. Parameters are collected on the first step, so model and guide must create them all on
the first call. Besides:

* the default loss is ``Trace_ELBO``'s estimator: fused
  (:class:`~pyro_bnnlv.infer.elbos.fused.FusedTraceElbo`) for the library's BNN and BNN+LV with a
  mean-field guide, Pyro's eager ``Trace_ELBO`` otherwise; ``loss=pb.CompiledTraceElbo()``
  compiles it (on request only).
* a compiled or fused loss is cross-checked against its eager twin at steps 1, 10, 100 and 1,000
  (:class:`~pyro_bnnlv.infer.elbos.jit_guard.JitGuard`); on a mismatch ``fit_svi`` warns once and
  restarts with the eager twin from the initial parameters and random state.
* ``torch.nn.Module`` models and guides train in a fresh Pyro parameter-store scope; bare
  ``pyro.param`` values are copied back afterwards, stale store entries under the fitted guide's
  names are replaced, and ``fit_svi`` warns when another live guide has the same names.
* divergence (a non-finite loss, or a parameter a distribution refuses) stops training with
  :class:`NonFiniteLossError` naming the step.

Each point in full: docs/design-notes.md, 'infer.svi'.
"""

from __future__ import annotations

import copy
import inspect
import math
import re
import sys
from dataclasses import dataclass
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyro
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.elbo import ELBO
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam
from torch import Tensor
from tqdm.auto import tqdm

from .._checks import check_int, check_real, check_seed
from .._state import isolated_param_store, set_seed
from ..param_names import param_fullnames
from ..protocols import LatentModel, NetworkModel

from .elbos.fused import FusedTraceElbo, fused_pair
from .elbos.jit_guard import JitGuard, forget_compiled, is_compiled, plate_shape_tracer_warnings_ignored
from .elbos.penalized import module_buffers

__all__ = ["NonFiniteLossError", "PlateauSchedule", "fit_svi", "isolated_param_store", "set_seed", "train_map"]


@dataclass(frozen=True)
class PlateauSchedule:
    """Decay Adam's learning rate on plateaus of the loss, and stop when it is spent.

    After every epoch (``steps_per_epoch`` steps; default ``ceil(N / batch_size)``, one step for
    full batches) the epoch's mean loss goes to ``torch.optim.lr_scheduler.ReduceLROnPlateau``:
    when it has not gone below its best so far for ``patience`` epochs the rate is
    multiplied by ``factor``; training stops once the rate is below ``min_lr`` (``num_steps``
    stays the cap). The defaults are the schedule of Pequignot et al. (2020), sec. 4.3: "a
    learning rate in [0.005, 0.0001) decreasing by a ratio of 0.7 when no progress is made in the
    variational objective after a patience of 30 epochs" (with ``lr=0.005``).
    """

    factor: float = 0.7
    patience: int = 30
    min_lr: float = 1e-4
    steps_per_epoch: int | None = None

    def __post_init__(self) -> None:
        factor = check_real(self.factor, "PlateauSchedule factor", positive=True)
        if not factor < 1:
            raise ValueError(f"PlateauSchedule factor must lie in (0, 1), got {self.factor!r}")
        check_int(self.patience, "PlateauSchedule patience", minimum=0)
        check_real(self.min_lr, "PlateauSchedule min_lr", positive=True)
        check_int(self.steps_per_epoch, "PlateauSchedule steps_per_epoch", allow_none=True)


class _PlateauStopper:
    """The epoch bookkeeping of a :class:`PlateauSchedule` around one optimizer."""

    def __init__(self, schedule: PlateauSchedule, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
        self.schedule, self.optimizer, self.steps_per_epoch = schedule, optimizer, steps_per_epoch
        # progress = an epoch mean below the best so far (absolute threshold 0): the default
        # relative threshold counts a slightly worse negative loss as progress (best * (1 - 1e-4)
        # lies above a negative best), so a negative ELBO loss would never decay
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode="min",
            factor=schedule.factor,
            patience=schedule.patience,
            threshold=0.0,
            threshold_mode="abs",
        )
        self.losses: list[float] = []

    def done(self, value: float) -> bool:
        """Record one step's loss; at an epoch's end step the scheduler; ``True``: stop."""
        self.losses.append(value)
        if len(self.losses) < self.steps_per_epoch:
            return False
        self.scheduler.step(sum(self.losses) / len(self.losses))
        self.losses = []
        return self.optimizer.param_groups[0]["lr"] < self.schedule.min_lr


class NonFiniteLossError(FloatingPointError):
    """Raised when training diverges: the loss became NaN or infinite, or (``detail``) a
    distribution refused a parameter the updates made invalid (a scale of 0, a NaN location);
    ``step`` is the 0-based step."""

    def __init__(self, step: int, value: float, detail: str | None = None) -> None:
        what = f"loss became non-finite ({value})" if detail is None else f"training diverged ({detail})"
        super().__init__(
            f"{what} at step {step}; try a smaller learning rate, "
            "a smaller initial guide scale, or check the data for extreme values"
        )
        self.step, self.value = step, value


_INVALID_PARAMETER = re.compile(
    r"Expected parameter (\w+) .*? of distribution (\w+).*?to satisfy the "
    r"constraint (.*?), but found invalid values",
    re.DOTALL,
)


def _invalid_parameter(err: ValueError) -> str | None:
    """For torch's argument validation error (``Expected parameter scale ... of distribution
    Normal ... to satisfy the constraint GreaterThan(lower_bound=0.0), but found invalid
    values``) a one-line summary, else ``None`` (another error: raised as it is)."""
    match = _INVALID_PARAMETER.match(str(err))
    if match is None:
        return None
    name, distribution, constraint = match.groups()
    return f"the {distribution} distribution's {name} became invalid: it must satisfy {constraint}"


class _Restart:
    """The training state before step 0's update, for restarting a compiled (or fused) loss's fit
    with its eager twin when :class:`~pyro_bnnlv.infer.elbos.jit_guard.JitGuard` finds a mismatch:
    the steps since the trace may have followed a frozen branch, so nothing they produced is kept.

    :meth:`restore` puts back the initial parameters (as created by step 0), a fresh Adam and
    plateau schedule, the buffers of the model and guide (an empirical-Bayes callback rewrites
    prior scales), the random state the fit started from and the loss histories; training then
    starts again at step 0 with the eager twin (callbacks see steps 0, 1, ... again). For a model
    and guide whose parameters are plain ``pyro.param`` statements this is the eager fit of the
    same seed; an autoguide drew its set-up at the first step, which is not repeated."""

    def __init__(self, rng: dict, loss: ELBO) -> None:
        self.rng = rng
        self.loss_records = len(getattr(loss, "history", ()))
        self.steps_taken = getattr(loss, "steps_taken", None)
        self.params: list[tuple[Tensor, Tensor]] = []

    def record(
        self,
        params: list[Tensor],
        optimizer: torch.optim.Optimizer,
        stopper: _PlateauStopper | None,
        model: object,
        guide: object,
    ) -> None:
        """After step 0's loss, before its update: the initial parameters and optimiser state."""
        self.params = [(p, p.detach().clone()) for p in params]
        self.optimizer, self.optimizer_state = optimizer, copy.deepcopy(optimizer.state_dict())
        self.stopper = stopper
        self.stopper_state = None if stopper is None else copy.deepcopy(stopper.scheduler.state_dict())
        self.buffers = [(m, name, b.detach().clone()) for m, name, b in module_buffers(model) + module_buffers(guide)]

    def restore(self, loss: ELBO, history: list[float]) -> int:
        """Back to the start (``loss``: the eager twin now training); returns 0, the next step."""
        with torch.no_grad():
            for p, value in self.params:
                p.copy_(value)
                p.grad = None
            for module, name, value in self.buffers:
                module._buffers[name] = value.clone()
        self.optimizer.load_state_dict(copy.deepcopy(self.optimizer_state))
        if self.stopper is not None:
            self.stopper.scheduler.load_state_dict(copy.deepcopy(self.stopper_state))
            self.stopper.losses = []
        pyro.util.set_rng_state(self.rng)
        history.clear()
        if isinstance(getattr(loss, "history", None), list):
            del loss.history[self.loss_records :]
        if self.steps_taken is not None:
            loss.steps_taken = self.steps_taken
        return 0


_fitted_guides: weakref.WeakValueDictionary[str, PyroModule] = weakref.WeakValueDictionary()


def _claim_param_names(guide: object) -> None:
    """After a fit: the global param store must hand ``guide`` (or a model with learned
    parameters, such as a learned noise scale) its own fitted values.

    Stale entries under its names (an earlier run's guide, or a guide of the same class used in
    raw Pyro calls) are dropped, so the next raw Pyro call registers the fitted tensors; when
    another live guide that ``fit_svi`` trained has the same (prefixed) names, one of the two
    would silently predict with the other's posterior, so this warns with the fix.
    """
    if not isinstance(guide, PyroModule):
        return
    prefix = guide._pyro_name
    other = _fitted_guides.get(prefix) if prefix else None
    if other is not None and other is not guide:
        warnings.warn(
            f"two fitted guides name their parameters {prefix!r}.* in Pyro's global param store; raw Pyro "
            f"calls (Predictive, SVI) would hand one the other's values. Give each guide its own names with "
            f"pyro_bnnlv.own_param_names(guide) right after building it, or use pyro_bnnlv.MeanField",
            UserWarning,
            stacklevel=3,
        )
    if prefix:
        _fitted_guides[prefix] = guide
    store = pyro.get_param_store()
    for name, p in param_fullnames(guide).items():
        if name in store._params and store._params[name] is not p:
            del store[name]  # a raw Pyro call re-registers the guide's own tensor


def _default_loss(model: object, guide: object) -> ELBO:
    """:class:`~pyro_bnnlv.infer.elbos.fused.FusedTraceElbo` for a pair it computes without
    traces (the library's BNN and BNN+LV with a mean-field guide,
    :func:`~pyro_bnnlv.infer.elbos.fused.fused_pair`), Pyro's eager ``Trace_ELBO`` for anything
    else (a user's model, an autoguide not recognised): the same estimator either way, and no
    ``torch.jit``, so a Python branch on a parameter's value is followed at every step."""
    return FusedTraceElbo() if fused_pair(model, guide) else Trace_ELBO()


def _loss_and_params(loss: ELBO, model, guide, x, y, kwargs) -> tuple[float, list[Tensor]]:
    """One ``loss_and_grads`` call that also collects the parameters it touched (as SVI does)."""
    with pyro.poutine.trace(param_only=True) as capture:
        value = loss.loss_and_grads(model, guide, x, y, **kwargs)
    params = {}
    for site in capture.trace.nodes.values():
        p = site["value"].unconstrained()
        params[id(p)] = p
    return value, list(params.values())


def _first_step(loss: ELBO, model, guide, x, y, kwargs) -> tuple[float, list[Tensor]]:
    """The first step, collecting the parameters. A compiled loss (requested: never the default)
    records its trace here; its tracer warnings are held and shown once the step is done, as if
    raised where they arose (:func:`_reemit`), or beside the step's error."""
    tracer_warnings: list[warnings.WarningMessage] = []
    try:
        with _tracer_warnings_held(tracer_warnings, hold=is_compiled(loss)), plate_shape_tracer_warnings_ignored():
            out = _loss_and_params(loss, model, guide, x, y, kwargs)
    except BaseException as err:  # the trace's warnings may explain the error
        _reemit_beside(tracer_warnings, err)
        raise
    _reemit(tracer_warnings)
    return out


@contextmanager
def _tracer_warnings_held(held: list[warnings.WarningMessage], hold: bool) -> Iterator[None]:
    """Collect the tracer warnings raised inside into ``held`` instead of showing them (``hold``;
    else nothing changes); other warnings pass as usual. :func:`_first_step` shows them with
    :func:`_reemit` once the compiled step is done."""
    if not hold:
        yield
        return
    show = warnings.showwarning

    def collect(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, torch.jit.TracerWarning):
            held.append(warnings.WarningMessage(message, category, filename, lineno, file, line))
        else:
            show(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", torch.jit.TracerWarning)  # held, so "error" waits for _reemit
        warnings.showwarning = collect
        yield


def _reemit(held: list[warnings.WarningMessage]) -> None:
    """Show held tracer warnings as if raised where they were: under the caller's filters with
    the warning's own module name and registry, so module filters apply (torch's own, which hides
    the tracer warnings of its internals, and the user's) and "default" shows each once; once per
    distinct location and text. Under an "error" filter the raised warning names its location.
    No ``module_globals``: the source line is read from the file, if any (a script read from
    standard input, ``python -``, has a ``__main__`` whose loader cannot give it)."""
    if not held:
        return
    by_file = {getattr(m, "__file__", None): m for m in list(sys.modules.values()) if m is not None}
    seen = set()
    for w in held:
        key = (w.category, w.filename, w.lineno, str(w.message))
        if key in seen:
            continue
        seen.add(key)
        module = by_file.get(w.filename)
        namespace = vars(module) if module is not None else None
        try:
            registry = None if namespace is None else namespace.setdefault("__warningregistry__", {})
            warnings.warn_explicit(
                w.message,
                w.category,
                w.filename,
                w.lineno,
                registry=registry,
                module=None if module is None else module.__name__,
            )
        except Warning as raised:  # an "error" filter
            raised.add_note(f"raised while tracing, at {w.filename}:{w.lineno}")
            raise


def _reemit_beside(held: list[warnings.WarningMessage], err: BaseException) -> None:
    """:func:`_reemit` while ``err`` is on its way out: a warning that an "error" filter turns
    into an exception becomes a note on ``err`` instead of replacing it."""
    try:
        _reemit(held)
    except Warning as raised:
        err.add_note(f"{type(raised).__name__} while tracing: {raised}")


def adam(params: list[Tensor], lr: float) -> torch.optim.Adam:
    """``torch.optim.Adam(params, lr=lr)``, with torch's fused kernel (one call per step for all
    parameters, ``fused=True``) when every parameter is a floating-point tensor on the CPU or a
    CUDA device, the devices it supports; the same update as the per-tensor loop to rounding."""
    fused = all(p.dtype.is_floating_point and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.Adam(params, lr=lr, fused=fused or None)


def _plateau_stopper(
    schedule: PlateauSchedule | None, optimizer: torch.optim.Optimizer, n: int, batch_size: int | None
) -> _PlateauStopper | None:
    """The schedule's stopper over ``optimizer`` (``None`` without a schedule); an epoch is
    ``schedule.steps_per_epoch`` steps, by default one pass over the ``n`` points."""
    if schedule is None:
        return None
    per_epoch = schedule.steps_per_epoch or (1 if batch_size is None else math.ceil(n / batch_size))
    return _PlateauStopper(schedule, optimizer, per_epoch)


def _check_fit_arguments(
    model: Callable,
    guide: Callable,
    x: Tensor,
    y: Tensor | None,
    num_steps: int,
    lr: float,
    batch_size: int | None,
    seed: int | None,
    callback: Callable | None,
    model_kwargs: dict | None,
    lr_schedule: PlateauSchedule | None,
) -> tuple[float, int | None]:
    """:func:`fit_svi`'s argument checks, before anything runs (errors name the argument and the
    fix; the model's own ``check_data`` before Pyro's trace appends its shape tables); returns the
    checked ``(lr, seed)``."""
    check_int(num_steps, "num_steps")
    check_int(batch_size, "batch_size", allow_none=True)
    lr = check_real(lr, "lr", positive=True)
    seed = check_seed(seed)
    for name, fn, example in (("model", model, "pb.BNN(pb.MLP(1, [50], 1))"), ("guide", guide, "pb.MeanField(model)")):
        if not callable(fn):
            raise TypeError(
                f"{name} must be a Pyro callable {name}(x, y, ...), e.g. {example}; got {type(fn).__name__}"
            )
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable as callback(step, loss) (or None), got {type(callback).__name__}")
    check = getattr(model, "check_data", None)
    if callable(check):
        accepted = inspect.signature(check).parameters
        check(x, y, **{k: v for k, v in (model_kwargs or {}).items() if k in accepted})
    if batch_size is not None and batch_size > len(x):
        raise ValueError(f"batch_size={batch_size} exceeds the number of data points {len(x)}")
    if lr_schedule is not None and not isinstance(lr_schedule, PlateauSchedule):
        raise TypeError(f"lr_schedule must be a pb.PlateauSchedule (or None), got {type(lr_schedule).__name__}")
    return lr, seed


def _guarded_step(
    guard: JitGuard,
    loss: ELBO,
    step: int,
    params: list[Tensor],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
) -> tuple[ELBO, float]:
    """One :meth:`JitGuard.step`; a distribution refusing a parameter the updates broke (its
    ``ValueError``) becomes :class:`NonFiniteLossError` naming the step and the parameter."""
    try:
        return guard.step(loss, step, params, model, guide, args, kwargs)
    except ValueError as err:
        detail = _invalid_parameter(err)
        if detail is None:
            raise
        raise NonFiniteLossError(step, math.nan, detail) from err


def _stop_requested(
    callback: Callable[[int, float], None] | None, stopper: _PlateauStopper | None, step: int, value: float
) -> bool:
    """Whether :func:`fit_svi` ends after ``step``: the callback raised ``StopIteration``, or else
    the plateau schedule's learning rate is spent."""
    if callback is not None:
        try:
            callback(step, value)
        except StopIteration:
            return True
    return stopper is not None and stopper.done(value)


def fit_svi(
    model: Callable,
    guide: Callable,
    x: Tensor,
    y: Tensor | None,
    *,
    num_steps: int,
    lr: float = 0.01,
    loss: ELBO | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    progress: bool = True,
    callback: Callable[[int, float], None] | None = None,
    model_kwargs: dict | None = None,
    check_jit: bool = True,
    lr_schedule: PlateauSchedule | None = None,
) -> list[float]:
    """Fit ``guide`` to ``model`` by SVI with Adam; return the loss (negative ELBO) per step.

    Each step is one ``loss.loss_and_grads`` call and one Adam update (see the module doc).

    Args:
        model, guide: Pyro callables ``model(x, y, batch_size=...)``; the library's models and any
            guide (``AutoNormal`` is mean-field VI, ``AutoMultivariateNormal`` full-covariance).
        x, y: training data (``y=None`` is passed through for models that allow it).
        num_steps: number of SVI steps.
        lr: Adam learning rate, a positive finite number (NumPy scalars accepted, bools not).
        loss: a Pyro ELBO; default: ``Trace_ELBO``'s estimator, fused for the library's models
            and mean-field guides, eager otherwise (see the module doc).
        batch_size: minibatch size for the model's ``"data"`` plate (``None``: full batch).
        seed: seeds torch / NumPy / Python before the first step (same seed, same numbers); an
            integer in ``[0, 2**32)`` or ``None``.
        progress: show a tqdm progress bar with the running loss.
        callback: called as ``callback(step, loss)`` after every step (e.g. empirical Bayes
            updates or early stopping by raising ``StopIteration``); checked callable up front.
        model_kwargs: further keyword arguments of ``model`` and ``guide`` (e.g. ``task=`` of a
            multi-task :class:`~pyro_bnnlv.models.projected.ProjectedBNN`).
        check_jit: cross-check a compiled or fused loss against its eager twin at steps 1, 10,
            100 and 1,000 and restart eagerly from the initial parameters on a mismatch (see the
            module doc). ``False`` trusts the compiled graph (benchmarks only).
        lr_schedule: a :class:`PlateauSchedule` (decay on plateaus, stop when the rate is
            spent; ``num_steps`` is then the cap), or ``None`` for a constant ``lr``. The
            returned history has one entry per step taken.

    Raises:
        NonFiniteLossError: training diverged (a NaN/inf loss, or a distribution parameter made
            invalid by the updates); the message names the step.
    """
    lr, seed = _check_fit_arguments(
        model, guide, x, y, num_steps, lr, batch_size, seed, callback, model_kwargs, lr_schedule
    )
    set_seed(seed)
    loss = _default_loss(model, guide) if loss is None else loss
    forget_compiled(loss)
    guard = JitGuard(steps=JitGuard.default_steps if check_jit else ())
    kwargs = dict(model_kwargs or {})
    if batch_size is not None:
        kwargs["batch_size"] = batch_size
    history: list[float] = []
    with isolated_param_store(model, guide):
        bar = tqdm(total=num_steps, disable=not progress, desc="SVI", leave=False)
        optimizer = stopper = restart = None
        step = 0
        while step < num_steps:
            if optimizer is None:
                if guard.steps and is_compiled(loss):
                    restart = _Restart(pyro.util.get_rng_state(), loss)
                value, params = _first_step(loss, model, guide, x, y, kwargs)
                optimizer = adam(params, lr)
                stopper = _plateau_stopper(lr_schedule, optimizer, len(x), batch_size)
                if restart is not None:
                    restart.record(params, optimizer, stopper, model, guide)
            else:
                loss, value = _guarded_step(guard, loss, step, params, model, guide, (x, y), kwargs)
                if guard.mismatch is not None and restart is not None:
                    step = restart.restore(loss, history)  # the eager twin, from the start
                    restart = None
                    bar.reset(total=num_steps)
                    bar.update(step)
                    continue
            if not math.isfinite(value):
                raise NonFiniteLossError(step, value)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            history.append(value)
            bar.update(1)
            if progress and (step % 50 == 0 or step == num_steps - 1):
                bar.set_postfix(loss=f"{value:.4g}")
            step += 1
            if _stop_requested(callback, stopper, step - 1, value):
                break
        bar.close()
    _claim_param_names(guide)
    _claim_param_names(model)
    return history


def train_map(
    model: NetworkModel,
    x: Tensor,
    y: Tensor,
    *,
    num_steps: int = 2000,
    lr: float = 0.01,
    batch_size: int | None = None,
    use_prior: bool = True,
    init: Tensor | None = None,
    seed: int | None = None,
    progress: bool = True,
) -> Tensor:
    """Point estimate of the flat weights by Adam: MAP (``use_prior=True``) or maximum likelihood.

    Maximises ``log p(y | x, w) + log p(w)`` (MAP) or ``log p(y | x, w)`` for a model exposing
    ``net``, ``noise_scale`` and ``prior_scale`` (:class:`~pyro_bnnlv.models.bnn.BNN` and
    subclasses), in plain PyTorch on the flat weight vector. The objective is divided by ``N``
    so the learning rate does not depend on the data size. Returns the weights (``(P,)``,
    detached); ``init`` (finite, ``(P,)``) defaults to ``net.init_weights`` drawn with ``seed``.
    ``y`` is required; ``lr`` and ``seed`` follow :func:`fit_svi`'s rules.

    Observation noise: a model built with ``learn_noise=True`` has ``sigma`` fitted jointly with
    ``w`` (``log sigma`` by Adam, from the model's current value; the likelihood then includes
    its ``-N log sigma`` term) and the fitted value written back to the model, as ``fit_svi``
    does; otherwise ``sigma`` is the model's fixed ``noise_scale``.
    """
    check_int(num_steps, "num_steps")
    check_int(batch_size, "batch_size", allow_none=True)
    lr = check_real(lr, "lr", positive=True)
    seed = check_seed(seed)
    if isinstance(model, LatentModel) or not isinstance(model, NetworkModel):
        raise TypeError(
            f"train_map fits the weights of a BNN with an N(prior_loc, prior_scale^2) prior; "
            f"{type(model).__name__} has other latent sites (per-point z, or w = g(z)): use "
            "pb.fit_svi(model, AutoDelta(model), x, y, ...) for its MAP"
        )
    net = model.net
    if y is None:
        raise TypeError("y must be a tensor of targets: train_map fits the weights to (x, y), got None")
    model.check_data(x, y)
    set_seed(seed)
    if init is None:
        w0 = net.init_weights(torch.Generator().manual_seed(0 if seed is None else seed))
    else:
        if not isinstance(init, Tensor):
            raise TypeError(
                f"init must be a tensor of {net.num_weights} starting weights (or None), got {type(init).__name__}"
            )
        net.check_weights(init, "init")
        if not bool(torch.isfinite(init.detach()).all()):
            raise ValueError(
                "init contains NaN or infinite values: pass finite starting weights "
                "(or init=None for the network's default initialisation)"
            )
        w0 = init.detach().clone()
    w = torch.nn.Parameter(w0.to(x.dtype))
    learn_noise = bool(getattr(model, "learn_noise", False))
    noise = getattr(model, "noise_scale", None)  # None: a classifier
    log_sigma = torch.nn.Parameter(torch.as_tensor(1.0 if noise is None else noise, dtype=x.dtype).detach().log())
    opt = adam([w, log_sigma] if learn_noise else [w], lr)
    N = x.shape[0]
    y2 = y.reshape(N, -1) if noise is not None else model._observed(y)
    for step in tqdm(range(num_steps), disable=not progress, desc="MAP", leave=False):
        idx = None if batch_size is None else torch.randint(N, (batch_size,))
        xb, yb = (x, y2) if idx is None else (x[idx], y2[idx])
        obj = map_objective(
            model, w, xb, yb, N, use_prior=use_prior, noise_scale=log_sigma.exp() if learn_noise else None
        )
        opt.zero_grad()
        obj.backward()
        opt.step()
        if not torch.isfinite(obj):
            raise NonFiniteLossError(step, float(obj.detach()) * N)
    if learn_noise:
        like = model.noise_scale
        model.noise_scale = PyroParam(log_sigma.detach().exp().to(like.dtype), constraint=constraints.positive)
    return w.detach()


def map_objective(
    model: torch.nn.Module,
    w: Tensor,
    x: Tensor,
    y: Tensor,
    n_total: int,
    use_prior: bool = True,
    noise_scale: Tensor | None = None,
) -> Tensor:
    """Minibatch estimate of ``-(log p(y | x, w) + log p(w)) / N`` up to constants.

    ``0.5 ||(y - f(x; w)) / sigma||^2 (N / B) + 0.5 ||(w - m) / s||^2``, divided by ``N``, for a
    model exposing ``net``, ``noise_scale``, ``prior_loc`` and ``prior_scale``; ``y`` is
    ``(B, L)``. The objective of :func:`train_map` and of FGE's cycles. A differentiable
    ``noise_scale`` (fitted jointly) adds the ``N L log sigma`` term that then depends on it;
    default: the model's fixed ``noise_scale``, where that term is a constant left out. For a
    classifier (``model.likelihood.classification``) the data term is the cross-entropy
    ``-sum_n log p(y_n | f(x_n; w)) (N / B)`` and ``y`` the labels as ``"obs"`` takes them.
    """
    likelihood = getattr(model, "likelihood", None)
    if likelihood is not None and likelihood.classification:
        obj = -likelihood.log_prob(model.net(x, w), y).sum() * (n_total / x.shape[0])
        if use_prior:
            obj = obj + 0.5 * ((w - model.prior_loc.detach()) / model.prior_scale.detach()).square().sum()
        return obj / n_total
    f = model.net(x, w).reshape(y.shape)
    if noise_scale is None:
        sigma = torch.as_tensor(model.noise_scale).detach()
        log_norm = 0.0
    else:
        sigma = noise_scale
        log_norm = n_total * y.shape[-1] * torch.log(sigma)
    obj = 0.5 * ((y - f) / sigma).square().sum() * (n_total / x.shape[0]) + log_norm
    if use_prior:
        obj = obj + 0.5 * ((w - model.prior_loc.detach()) / model.prior_scale.detach()).square().sum()
    return obj / n_total
