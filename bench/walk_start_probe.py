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
K = torch._C.DispatchKey
def show(where):
    w = _active_walk()
    inc = [k for k in ("Python", "PythonTLSSnapshot", "PreDispatch") if torch._C._dispatch_tls_is_dispatch_key_included(getattr(K, k))]
    exc = [k for k in ("Python", "PythonTLSSnapshot", "PreDispatch") if torch._C._dispatch_tls_is_dispatch_key_excluded(getattr(K, k))]
    print(where, None if w is None else (w.kernel, w.iteration), [type(m).__name__ for m in _get_current_dispatch_mode_stack()], "inc", inc, "exc", exc, flush=True)
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
    opt.step(); opt.zero_grad()
    show(f"after step {step}")
