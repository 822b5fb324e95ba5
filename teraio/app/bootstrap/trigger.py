"""The mode that starts the agent at the job's first op on the plan's device (Note [Lazy start]
in teraio/app/bootstrap/__init__.py)."""

import random
import sys
import threading
from contextlib import contextmanager

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack, _pop_mode, _push_mode


def device_touched(device_type: str, args, kwargs) -> torch.device | None:
    """The device of that type an op reads, writes or makes a tensor on: a `device=` there, a
    tensor argument there, or (on CPU) a factory op with neither, which makes CPU tensors."""
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == device_type:
        return torch.device(device)
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
    if not tensors:
        return torch.device("cpu") if device is None and device_type == "cpu" else None
    return next((t.device for t in tensors if t.device.type == device_type), None)



@contextmanager
def _job_draws_kept():
    """Note [The job's random draws]: the agent starts inside the job, after its script seeded
    Python's and numpy's global generators, and what it imports then may draw from them (rich's
    style module draws 24 bits from `random` as it loads): a script shuffling its samples with
    `random` then trained on other batches than plainly. Their states are put back as they were."""
    python_state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(python_state)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)

class StartOnFirstOp(TorchDispatchMode):
    """Starts the agent right before the first op on the plan's device, then steps aside."""

    def __init__(self, settings, thread: int):
        super().__init__()
        self.settings = settings
        self.device_type = settings.device_type()
        self.thread = thread          # modes are per thread: the one that imported torch
        self.pending = True
        self.running_modules: list[torch.nn.Module] = []
        self._handles = []

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Until the agent starts (never, in a process that does not train) torch.compile must
        # work as in a plain run; Dynamo skips frames under any mode that says otherwise.
        return True

    def push(self) -> None:
        self._handles = [
            register_module_forward_pre_hook(self._module_enter),
            register_module_forward_hook(self._module_exit),
            register_optimizer_step_pre_hook(self._optimizer_enter),
        ]
        _push_mode(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.pending:
            device = device_touched(self.device_type, args, kwargs)
            if device is not None:
                self.pending = False
                self._start(device)
        return func(*args, **kwargs)

    def _start(self, device: torch.device) -> None:
        from teraio import compile_guard
        from teraio.app.bootstrap import is_dataloader_worker, start_guarded

        if is_dataloader_worker():
            return
        # The first op may run under no_grad, inference_mode or a `with torch.device(...)`
        # block: the agent's own tensors (its host pool) must not be made under them.
        with torch.inference_mode(False), torch.enable_grad(), torch._C.DisableTorchFunction(), _job_draws_kept():
            agent = start_guarded(self.settings, device.index)
        walk = getattr(agent, "walk", None)
        from teraio.walk import _active_walk

        if walk is None or _active_walk() is not walk:
            return
        for module in self.running_modules:
            walk._module_enter(module, ())  # as if its pre-hook had seen them enter
        compile_guard.walk_started()

    # ----- hooks: the module stack before the start, and stepping aside after it ----------
    def _module_enter(self, module, args) -> None:
        if threading.get_ident() != self.thread:
            return
        if self.pending:
            self.running_modules.append(module)
        else:
            self.retire()

    def _module_exit(self, module, args, output) -> None:
        if self.pending and threading.get_ident() == self.thread and self.running_modules:
            self.running_modules.pop()

    def _optimizer_enter(self, optimizer, args, kwargs) -> None:
        if not self.pending and self._handles and threading.get_ident() == self.thread:
            self.retire()

    def retire(self) -> None:
        """Leave the mode stack and remove the module hooks: after the start the trigger costs
        nothing. The optimizer pre-hook stays, doing nothing: torch calls those hooks while
        iterating over their dict, and one removing itself there (a script whose first step
        comes before any module call) fails the step with "OrderedDict mutated during iteration"."""
        for handle in self._handles[:2]:
            handle.remove()
        self._handles = []
        self.running_modules = []
        stack = _get_current_dispatch_mode_stack()
        if self not in stack:
            return
        # Note [Modes pushed again]: every mode is pushed again, not only those above the
        # trigger: the walk was pushed from inside the trigger's handler, and when the op that
        # started it made a device tensor from host ones (`model.to("cuda")`), the thread's
        # dispatch keys were left off as that handler returned (seen on the H200, torch 2.11):
        # the job's ops then bypassed the walk, and the trace held the backward's 12 detaches
        # of a 6-layer model and nothing else. Pushing sets the keys from the stack again.
        popped = [_pop_mode() for _ in stack]
        for mode in reversed(popped):  # modes the job pushed since stay, in order
            if mode is not self:
                _push_mode(mode)
