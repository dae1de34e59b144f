"""Horovod's DistributedOptimizer over a pipesgd method (and PartialDistributedOptimizer, which
raises).

``DistributedOptimizer(...)`` returns an instance of the wrapped optimizer's class whose step() is
the method's: the C++ library's DistributedOptimizer (pipesgd._C) communicates, and by default the
wrapped optimizer's own step() applies the gradient it hands over in p.grad (``fused_update=True``:
the method's own SGD/Adam). Here only the mapping of Horovod's and pipesgd's keyword arguments to
the C++ options, the layers of the model, and the method's traits as the registry states them.
"""

import contextlib
import re
import warnings
import weakref

import torch

from pipesgd import _C
from pipesgd.torch._runtime import _state, _worker
from pipesgd.torch.basics import rank
from pipesgd.torch.compression import Compression, FP16Compressor, NoneCompressor
from pipesgd.torch.mpi_ops import _OP_NAMES, Adasum, Average, Sum
from pipesgd.torch.process_sets import _set_id, global_process_set


# Keyword arguments that name a CLI flag differently; the rest map name_with_underscores ->
# --name-with-underscores.
_FLAG_ALIASES = {"staleness": "--staleness-k", "k": "--staleness-k"}
# A method whose gradients are K-1 steps stale with nothing compensating (the registry's trait
# stale_without_compensation: Pipe-SGD) under momentum: momentum amplifies a stale gradient, and from
# momentum 0.5 on the accuracy loss against synchronous training passes 1 point (6.5 at 0.9; the
# CLI's train/compare warn alike, docs/user-guide.md "Momentum with a stale method"). Warned once per
# process.
_STALE_MOMENTUM_WARNING = 0.5
_STALE_MOMENTUM_ADVICE = 0.3
_stale_momentum_warned = False


def _warn_stale_momentum(spec, traits, flags, param_groups):
    global _stale_momentum_warned
    momentum = max(float(group.get("momentum", 0) or 0) for group in param_groups)
    try:
        k = int(flags.get("--staleness-k", 2))
    except ValueError:
        return  # the method's own check says what is wrong
    if _stale_momentum_warned or not traits.get("stale_without_compensation") or k < 2 \
            or momentum < _STALE_MOMENTUM_WARNING:
        return
    _stale_momentum_warned = True
    steps = "step" if k == 2 else "steps"
    warnings.warn(f"pipesgd.torch: method '{spec}' applies gradients {k - 1} {steps} stale (K = {k}) and momentum "
                  f"{momentum:g} amplifies them: expect lower accuracy (at momentum 0.9, 4 to 10 points below dsync: "
                  f"docs/results.md); use method='sapipe' (with model=your_module, fused_update=True; or 'sapipe+dc' "
                  f"with your optimizer), momentum <= {_STALE_MOMENTUM_ADVICE:g}, or 'dsync'",
                  stacklevel=4)
# The C++ options that Python sets from elsewhere than a method keyword: the wrapped optimizer's
# hyper-parameters (fused_update=True), DistributedOptimizer's timeout=, init's servers=.
_KEYWORDS_OF_FLAGS = {"--lr": "lr", "--momentum": "momentum", "--weight-decay": "weight_decay",
                      "--adam-beta1": "betas", "--adam-beta2": "betas", "--adam-eps": "eps",
                      "--comm-timeout": "timeout", "--servers": "servers"}
_FLAG_PATTERN = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def _python_names(message, keyword_of_flag):
    """A message of the C++ option checks (which name the CLI's flags) in the names a Python user
    wrote: --staleness-k -> staleness=, --warmup-iters -> warmup_iters=, --comm-timeout -> timeout=.
    `keyword_of_flag`: flag -> the keyword the user gave for it (aliases included)."""
    def keyword(match):
        flag = match.group(0)
        name = keyword_of_flag.get(flag) or _KEYWORDS_OF_FLAGS.get(flag) or match.group(1).replace("-", "_")
        return name + "="
    return _FLAG_PATTERN.sub(keyword, message)


def _hyper_parameters(optimizer):
    """The C++ optimizer options from the wrapped torch optimizer (class and param_groups)."""
    groups = optimizer.param_groups
    first = {k: v for k, v in groups[0].items() if k not in ("params", "initial_lr")}
    for index, group in enumerate(groups[1:], start=1):
        other = {k: v for k, v in group.items() if k not in ("params", "initial_lr")}
        if other != first:
            different = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            raise ValueError(f"pipesgd.torch.DistributedOptimizer: param_groups 0 and {index} differ in "
                             f"{', '.join(different)}; pipesgd trains every parameter with one set of "
                             "hyper-parameters (use one group)")
    kind = type(optimizer)
    bases = [c for c in kind.__mro__ if c in (torch.optim.SGD, torch.optim.Adam)]
    if not bases:
        raise ValueError(f"pipesgd.torch.DistributedOptimizer: {kind.__name__} is not supported; pipesgd's "
                         "methods update with torch.optim.SGD (momentum, weight_decay) or torch.optim.Adam")
    options = {"learning_rate": float(first["lr"]), "weight_decay": float(first.get("weight_decay", 0.0))}
    if bases[0] is torch.optim.SGD:
        if first.get("nesterov", False):
            raise ValueError("pipesgd.torch.DistributedOptimizer: SGD with nesterov=True is not supported")
        if first.get("dampening", 0) != 0:
            raise ValueError("pipesgd.torch.DistributedOptimizer: SGD with dampening != 0 is not supported")
        if first.get("maximize", False):
            raise ValueError("pipesgd.torch.DistributedOptimizer: maximize=True is not supported")
        options.update(optimizer="sgd", momentum=float(first.get("momentum", 0.0)))
    else:
        if first.get("amsgrad", False):
            raise ValueError("pipesgd.torch.DistributedOptimizer: Adam with amsgrad=True is not supported")
        if first.get("maximize", False):
            raise ValueError("pipesgd.torch.DistributedOptimizer: maximize=True is not supported")
        beta1, beta2 = first["betas"]
        options.update(optimizer="adam", adam_beta1=float(beta1), adam_beta2=float(beta2),
                       adam_eps=float(first["eps"]))
    return first, options


def _layers(optimizer, named_parameters, model):
    """(name, [parameters]) per layer, in the model's order: the modules that own parameters directly
    (with model=), else the named parameters grouped by their module path (the name before the last dot)."""
    trained = {id(p) for group in optimizer.param_groups for p in group["params"] if p.requires_grad}
    layers = []
    if model is not None:
        for module_name, module in model.named_modules():
            parameters = [p for p in module.parameters(recurse=False) if id(p) in trained]
            seen = {id(p) for _, ps, _ in layers for p in ps}
            parameters = [p for p in parameters if id(p) not in seen]
            if parameters:
                layers.append((module_name or "(root)", parameters, module))
        return layers
    by_name = {}
    for name, parameter in named_parameters:
        if id(parameter) not in trained:
            continue
        layer = name.rsplit(".", 1)[0] if "." in name else name
        if layer not in by_name:
            by_name[layer] = []
            layers.append((layer, by_name[layer], None))
        by_name[layer].append(parameter)
    return layers


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, method, model, method_options, timeout, fused_update, process_set_id):
        self._wrapped_class.__init__(self, params)  # shares the wrapped optimizer's param_groups
        worker = _worker()
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v) for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) or len(p) != 2 for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually "
                             "produced by model.named_parameters()")
        names = [name for name, _ in named_parameters]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: "
                             f"{', '.join(duplicates)}")
        self._parameter_names = {p: name for name, p in named_parameters}  # Horovod's attribute
        named_ids = {id(p) for _, p in named_parameters}
        unnamed = [p for group in self.param_groups for p in group["params"] if id(p) not in named_ids]
        if unnamed and model is None:
            raise ValueError(f"named_parameters was specified, but one or more model parameters were not named. "
                             f"Python object ids: {', '.join(str(id(p)) for p in unnamed)}")
        if op == Adasum:
            raise NotImplementedError("pipesgd.torch.DistributedOptimizer: op=Adasum is not supported; use "
                                      "op=hvd.Average (or one of pipesgd's methods: method=...)")
        if op not in (Average, Sum):
            raise ValueError(f"DistributedOptimizer: op must be hvd.Average or hvd.Sum, got {_OP_NAMES.get(op, op)}")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if not gradient_predivide_factor > 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}")
        spec = _C.default_method() if method is None else str(method)  # the CLI's default --algo
        if method_options.get("warmup_epochs", 0) not in (0, "0"):
            raise ValueError("warmup_epochs= needs the iterations of one epoch, which pipesgd.torch does not know: "
                             "give warmup_iters= (iterations) instead")
        flags = {}
        for key, value in method_options.items():
            flag = _FLAG_ALIASES.get(key, "--" + key.replace("_", "-"))
            flags[flag] = str(value).lower() if isinstance(value, bool) else str(value)
        if compression is Compression.fp16 or compression is FP16Compressor:
            if "+" in spec and any(part in ("bf16", "int8", "none") for part in spec.split("+")[1:]) \
                    or "--codec" in flags:
                raise ValueError(f"compression=Compression.fp16 and method '{spec}' both choose a codec; give one")
            flags["--codec"] = "bf16"
        elif compression is not Compression.none and compression is not NoneCompressor:
            raise ValueError("DistributedOptimizer: compression must be hvd.Compression.none or hvd.Compression.fp16 "
                             "(pipesgd compresses inside the ring; method='...+int8' for 8 bits)")
        layers = _layers(self, named_parameters, model)
        if not layers:
            raise ValueError("DistributedOptimizer: no parameter that requires grad")
        # What the method's registry entry states about it (algo/method_descriptor.h, MethodTraits); nothing
        # for a name the registry does not know (the C++ optimizer says what is wrong with it).
        base = spec.split("+")[0]
        traits = {m["name"]: m for m in _C.available_methods()}.get(base, {})
        servers_update = bool(traits.get("uses_servers"))
        if fused_update is None:
            fused_update = servers_update
        elif not fused_update and servers_update:
            raise ValueError(f"method '{spec}' applies the update on its parameter servers (SGD): your optimizer "
                             "cannot apply it (fused_update=False is not possible); use a worker-only method")
        # The general path (the default): the method hands each step's gradient over as p.grad and the
        # wrapped optimizer's own step() applies it. The fused path: the method updates with its own
        # SGD/Adam, taken from the wrapped optimizer's class and param_groups.
        self._fused = bool(fused_update)
        if self._fused:
            hyper, options = _hyper_parameters(self)
            self._hyper = hyper
        else:
            options = {"optimizer": "external"}
        self._forward_hooks = model is not None and self._fused
        _warn_stale_momentum(spec, traits, flags, self.param_groups)
        if traits.get("needs_forward_hooks") and model is None and self._fused:
            warnings.warn(f"pipesgd.torch: method '{base}' applies its synchronous layers' updates just before each "
                          "layer's forward through module forward pre-hooks: pass model=your_module to "
                          "DistributedOptimizer; without it they are applied at step()", stacklevel=3)
        if servers_update and _state.servers == 0:
            raise ValueError(f"method '{spec}' needs parameter-server ranks: call hvd.init(servers=S) and launch "
                             f"with S more ranks than workers")
        options.update(flags=flags, backward_passes_per_step=backward_passes_per_step, sum=(op == Sum),
                       forward_hooks=self._forward_hooks, process_set=process_set_id)
        if self._fused:
            options["lr_schedule"] = "external"
        if timeout is not None:
            options["timeout"] = float(timeout)
        if self._fused and not options["learning_rate"] > 0:
            initial = self.param_groups[0].get("initial_lr", 0.0)
            if not initial > 0:
                raise ValueError(f"DistributedOptimizer: the learning rate is {options['learning_rate']}; pipesgd "
                                 "needs a positive rate at construction (set it later with a scheduler)")
            options["learning_rate"] = float(initial)
        try:
            self._pipesgd = _C.DistributedOptimizer(worker, [(name, params) for name, params, _ in layers], spec,
                                                    options)
        except ValueError as error:  # the option checks name the CLI's flags: say the keywords instead
            keyword_of_flag = {_FLAG_ALIASES.get(key, "--" + key.replace("_", "-")): key for key in method_options}
            raise type(error)(_python_names(str(error), keyword_of_flag)) from None
        if not self._fused:
            # finish() applies the updates still in flight one after another, each by the wrapped step().
            myself = weakref.ref(self)
            self._pipesgd.set_apply_callback(lambda: myself()._apply_gradients())
        _state.optimizers.add(self)
        self._method = spec
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = []
        if self._forward_hooks:
            for index, (_, _, module) in enumerate(layers):
                self._hook_handles.append(module.register_forward_pre_hook(self._make_forward_hook(index)))

    def _make_forward_hook(self, index):
        optimizer = self._pipesgd

        def hook(module, inputs):
            if module.training and torch.is_grad_enabled():
                optimizer.before_layer_forward(index)
        return hook

    @property
    def method(self):
        """The pipesgd method spec this optimizer trains with ("dsync", "pipe+int8", ...)."""
        return self._method

    def _check_hyper_parameters(self):
        current = {k: v for k, v in self.param_groups[0].items() if k not in ("params", "initial_lr", "lr")}
        expected = {k: v for k, v in self._hyper.items() if k != "lr"}
        if current != expected:
            changed = sorted(k for k in set(current) | set(expected) if current.get(k) != expected.get(k))
            raise ValueError(f"DistributedOptimizer: {', '.join(changed)} changed after construction; pipesgd "
                             "follows the learning rate only")
        lrs = {group["lr"] for group in self.param_groups}
        if len(lrs) != 1:
            raise ValueError("DistributedOptimizer: param_groups have different learning rates; pipesgd uses one")
        return float(self.param_groups[0]["lr"])

    @property
    def fused_update(self):
        """True if the method applies the update with its own SGD/Adam (fused_update=True, or a
        parameter-server method); False if the wrapped optimizer's step() applies it (the default)."""
        return self._fused

    def _apply_gradients(self):
        """The wrapped optimizer's own step() on the gradients in p.grad. An optimizer that takes
        sparse gradients only (torch.optim.SparseAdam) gets each as a sparse tensor (the averaged
        gradient, as Horovod's sparse allreduce gives it); p.grad is the dense view again afterwards."""
        if not issubclass(self._wrapped_class, torch.optim.SparseAdam):
            self._wrapped_class.step(self)
            return
        dense = [(p, p.grad) for group in self.param_groups for p in group["params"] if p.grad is not None]
        for p, grad in dense:
            p.grad = grad.to_sparse()
        try:
            self._wrapped_class.step(self)
        finally:
            for p, grad in dense:
                p.grad = grad

    def _plain_sgd(self):
        """(lr, weight_decay) when the wrapped optimizer is torch.optim.SGD itself without momentum
        (stateless) and every param group has the same lr and weight decay: the method then applies
        that rule in its own pass (the fast path: the same update, one pass over the parameters
        less); None otherwise."""
        if self._wrapped_class is not torch.optim.SGD:
            return None
        first = self.param_groups[0]
        for group in self.param_groups:
            if group.get("momentum", 0) != 0 or group.get("nesterov", False) or group.get("maximize", False) \
                    or group.get("differentiable", False) or group["lr"] != first["lr"] \
                    or group.get("weight_decay", 0) != first.get("weight_decay", 0):
                return None
        return float(first["lr"]), float(first.get("weight_decay", 0))

    def _take_plain_sgd_fast_path(self):
        plain = self._plain_sgd()
        if plain is not None:
            self._pipesgd.apply_plain_sgd(*plain)
        return plain is not None

    def step(self, closure=None):
        """This step's gradients go to the method. General path (the default): the method's step
        (unless synchronize() ran it) leaves the gradient to apply in p.grad (this step's average;
        a pipelined method's earlier one; None for a parameter that gets no update this step), and the
        wrapped optimizer's step() applies it, with its own rule, param_groups and learning rate.
        Fused path: the method communicates and updates with its own SGD/Adam at the
        param_groups' learning rate of this call."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._synchronized and self._should_synchronize:
            warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                          "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                          "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                          "your code.")
        if self._fused:
            if self._synchronized:
                self._synchronized = False
                return loss
            self._pipesgd.set_learning_rate(self._check_hyper_parameters())
            self._pipesgd.step()
            return loss
        if self._synchronized:
            self._apply_gradients()  # what synchronize() handed over, as edited since
        else:
            applied_by_the_method = self._take_plain_sgd_fast_path()
            self._pipesgd.synchronize_gradients()
            if not applied_by_the_method:
                self._apply_gradients()
        self._synchronized = False
        self._pipesgd.step()  # arms the next backward
        return loss

    def synchronize(self):
        """Completes this step's communication now: the gradients to apply are in p.grad afterwards,
        readable and editable (clipping, ...); the step() that follows applies what is there."""
        if self._synchronized:
            return
        if self._fused:
            raise ValueError(f"DistributedOptimizer.synchronize(): method '{self._method}' applies the update "
                             "inside the method (fused_update=True or a parameter-server method), so the "
                             "gradients cannot be read or edited before step(); use the default "
                             "fused_update=False with a worker-only method")
        self._pipesgd.synchronize_gradients()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """A context in which step() does not synchronize (it was done by synchronize())."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients the next backward accumulates into (each step leaves them zero)."""
        self._pipesgd.zero_grad()

    def finish(self):
        """Applies every update still in flight (a pipelined method's last K steps): the model's
        parameters are final after it. Further steps raise."""
        if not self._fused:
            self._take_plain_sgd_fast_path()
        self._pipesgd.finish()

    @property
    def iteration(self):
        return self._pipesgd.iteration

    def state_dict(self):
        """The wrapped optimizer's state_dict, plus the method's state (its updates in flight, codec
        residuals, ...) under the key "pipesgd": torch.save it and load_state_dict() it into a new
        DistributedOptimizer of the same configuration to resume bit for bit. Call it between step()
        and the next backward (it waits for the communication in flight)."""
        if self._fused:
            raise ValueError(f"DistributedOptimizer.state_dict(): method '{self._method}' keeps its update's state "
                             "inside the method (fused_update=True or a parameter-server method); use "
                             "save_state()/load_state(), or the default fused_update=False with a worker-only method")
        state = self._wrapped_class.state_dict(self)
        state["pipesgd"] = {"method": self._method, "state": self._pipesgd.save_state()}
        return state

    def load_state_dict(self, state_dict):
        """The wrapped optimizer's state, and the method's state saved with it by state_dict(): call it on a
        new DistributedOptimizer before its first backward (on every rank, each with its own state for a
        bit-identical resume of the method's per-rank state)."""
        if self._fused:
            raise ValueError(f"DistributedOptimizer.load_state_dict(): method '{self._method}' keeps its update's "
                             "state inside the method (fused_update=True or a parameter-server method); use "
                             "load_state(), or the default fused_update=False with a worker-only method")
        state_dict = dict(state_dict)
        method_state = state_dict.pop("pipesgd", None)
        if method_state is not None and method_state.get("method") != self._method:
            raise ValueError(f"DistributedOptimizer.load_state_dict: the state was saved with method "
                             f"'{method_state.get('method')}', this optimizer's is '{self._method}'")
        self._wrapped_class.load_state_dict(self, state_dict)
        if method_state is not None:
            self._pipesgd.load_state(method_state["state"])

    def save_state(self):
        """fused_update=True: step(), then the optimizer's whole state after it as bytes (resume with
        load_state). The general path keeps the wrapped optimizer's state too: use state_dict()."""
        if not self._fused:
            raise ValueError("DistributedOptimizer.save_state() is the fused path's (fused_update=True); here the "
                             "wrapped optimizer applies the update: save optimizer.state_dict() (it holds the "
                             "method's state too) and resume with load_state_dict()")
        self._pipesgd.set_learning_rate(self._check_hyper_parameters())
        return self._pipesgd.step_and_save_state()

    def load_state(self, state):
        """Continues from save_state()'s bytes (fused_update=True; a new optimizer, before its first backward)."""
        if not self._fused:
            raise ValueError("DistributedOptimizer.load_state() is the fused path's (fused_update=True); use "
                             "load_state_dict() with what state_dict() returned")
        self._pipesgd.load_state(state)


class _OutsideProcessSetOptimizer(torch.optim.Optimizer):
    """DistributedOptimizer on a rank outside its process set: the wrapped optimizer, alone."""

    def __init__(self, params):
        self._wrapped_class.__init__(self, params)

    def synchronize(self):
        pass

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set, method=None, model=None,
                         timeout=None, fused_update=None, **method_options):
    """Horovod's DistributedOptimizer, training with a pipesgd method.

    The result is an instance of the wrapped optimizer's class (sharing its param_groups, so
    schedulers on either work) whose step() is the method's. Horovod's arguments keep their
    meaning; num_groups/groups (fusion groups) and sparse_as_dense are accepted and do nothing
    (pipesgd's methods choose their own buckets: method="dsync+optimal", "wfbp", ...).
    pipesgd's: ``method`` a method spec as the CLI's --algo (default "dsync"; "auto[:POLICY]" chooses
    one in the run from its first iterations and says which on rank 0's stderr); ``model`` the module
    (its layers become pipesgd's layers, and SAPipe applies updates from its forward pre-hooks);
    ``timeout`` seconds any wait may take; any other keyword is a method option of the CLI, e.g.
    ``staleness=2`` (--staleness-k), ``warmup_iters=100``, ``stale_layers=3``,
    ``compensation="dc"``, ``allreduce="tree"``.
    ``fused_update``: None (default) or False: the wrapped optimizer's step() applies the gradient
    the method hands over in p.grad (any torch.optim optimizer); True: the method updates with its
    own fused SGD/Adam (torch.optim.SGD without nesterov/dampening, or Adam without amsgrad, one set
    of hyper-parameters; synchronize() and state_dict() raise). The parameter-server methods are
    always fused (their servers apply the update).
    """
    process_set_id = _set_id(process_set, "DistributedOptimizer")
    if process_set_id != 0 and rank() not in _worker().process_set_ranks(process_set_id):
        # Horovod's rule: a rank outside the optimizer's process set trains alone (no communication).
        cls = type(optimizer.__class__.__name__, (_OutsideProcessSetOptimizer, optimizer.__class__),
                   {"_wrapped_class": optimizer.__class__})
        return cls(optimizer.param_groups)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"DistributedOptimizer: expected a torch.optim.Optimizer, got {type(optimizer)}")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("DistributedOptimizer: the optimizer is already a DistributedOptimizer")
    # An instance of the user's optimizer class (isinstance and schedulers work) whose methods are ours.
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__),
               {"_wrapped_class": optimizer.__class__})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, method, model, method_options, timeout, fused_update, process_set_id)


def PartialDistributedOptimizer(*args, **kwargs):  # noqa: N802 (Horovod's name)
    """Not supported: pipesgd's methods synchronize every parameter of the model."""
    raise NotImplementedError("pipesgd.torch.PartialDistributedOptimizer is not supported: every parameter given to "
                              "DistributedOptimizer is synchronized (give named_parameters= only the shared ones and "
                              "step the local ones with their own torch.optim optimizer)")
