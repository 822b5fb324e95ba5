"""Where the walk starts on CUDA, and whether it sees the job's ops (docs/gpu-results.md, ninth session).

    teraio profile -o /tmp/s.msgpack -- python bench/walk_start_probe.py moved      # model.to("cuda")
    teraio profile -o /tmp/s.msgpack -- python bench/walk_start_probe.py repush     # the modes pushed again by hand

Prints at each stage the walk's kernel count and iteration, the mode stack, and whether the
thread's dispatch keys for Python modes are on. Needs a GPU.
"""

import sys

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode, _push_mode

from teraio.walk import _active_walk

KEYS = ("Python", "PythonTLSSnapshot", "PreDispatch")


def show(where: str) -> None:
    walk = _active_walk()
    included = [k for k in KEYS if torch._C._dispatch_tls_is_dispatch_key_included(getattr(torch._C.DispatchKey, k))]
    excluded = [k for k in KEYS if torch._C._dispatch_tls_is_dispatch_key_excluded(getattr(torch._C.DispatchKey, k))]
    stack = [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
    counts = None if walk is None else (walk.kernel, walk.iteration)
    print(where, counts, stack, "inc", included, "exc", excluded, flush=True)


variant = sys.argv[1]
show("start")
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)).to("cuda")
show("after .to")
if variant == "repush":
    modes = [_pop_mode() for _ in range(len(_get_current_dispatch_mode_stack()))]
    for m in reversed(modes):
        _push_mode(m)
    show("after repush")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(8, 64).to("cuda")
show("after input")
for step in range(6):
    y = model(x)
    show(f"after forward {step}")
    y.sum().backward()
    opt.step()
    opt.zero_grad()
    show(f"after step {step}")
