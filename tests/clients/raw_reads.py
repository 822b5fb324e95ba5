"""An MLP trained with AdamW whose loop reads optimizer state the plan has moved out through
the ways user code reads a tensor's bytes without an ATen op the walk sees (tolist, numpy,
repr, storage reads and copies, pickling, DLPack). Every other step from --read-from on, one
path reads the state of one layer right after optimizer.step(), when the plan's wrap-around
offloads have sent it out; the steps between let the plan, paused by the reads' unplanned ops,
move it out again. Writes the losses, what each path read (floats as their bytes in hex, bit
for bit) and how many of the storages each path read had no device memory just before; a
path that raised has its error instead, and the job goes on (one broken path fails one test).
"""

import argparse
import copy
import io
import json
import pickle
import warnings

import numpy as np
import torch

WIDTH, DEPTH, BATCH = 64, 5, 16   # DEPTH: the five reads that pin (last) each pin a layer of their own
STATE_KEYS = ("exp_avg", "exp_avg_sq")


def _hex(values) -> str:
    """A (nested) list of float32 values, bit for bit."""
    return np.asarray(values, dtype=np.float32).tobytes().hex()


def _storage(t):
    return t.untyped_storage()


def _typed(t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # TypedStorage is deprecated, not gone
        return t.storage().tolist()


def _cast(t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return t.storage().double().float().tolist()


def _storage_copy(t):
    copied = torch.UntypedStorage(_storage(t).nbytes() or t.numel() * t.element_size())
    copied.copy_(_storage(t))
    return bytes(copied).hex()


# path -> a read of one tensor, returning something JSON compares bit for bit
READS = {
    "tolist": lambda t: _hex(t.tolist()),
    "row_tolist": lambda t: _hex(t[1].tolist()),
    "item": lambda t: _hex([t.reshape(-1)[3].item()]),
    "repr": lambda t: repr(t),
    "str_row": lambda t: str(t[2]),
    "storage_tolist": lambda t: bytes(_storage(t).tolist()).hex(),
    "storage_bytes": lambda t: bytes(_storage(t)).hex(),
    "storage_index": lambda t: [_storage(t)[5], _storage(t)[-1]],
    "storage_repr": lambda t: repr(_storage(t)),
    "typed_storage_tolist": lambda t: _hex(_typed(t)),
    "storage_copy": _storage_copy,
    "storage_clone": lambda t: bytes(_storage(t).clone()).hex(),
    "deepcopy": lambda t: _hex(copy.deepcopy(t).tolist()),
    "pickle": lambda t: _hex(pickle.loads(pickle.dumps(t)).tolist()),
    "torch_save": lambda t: _hex(_saved_and_loaded(t).tolist()),
    "torch_save_legacy": lambda t: _hex(_saved_and_loaded(t, _use_new_zipfile_serialization=False).tolist()),
    "torch_save_storage": lambda t: bytes(_saved_and_loaded({"s": _storage(t)})["s"]).hex(),
    "typed_storage_cast": lambda t: _hex(_cast(t)),
    "copy": lambda t: _hex(copy.copy(t).tolist()),
    # these pin what they read (it never moves again): last, a layer each
    "storage_slice": lambda t: bytes(_storage(t)[8:40]).hex(),
    "numpy": lambda t: t.numpy().tobytes().hex(),
    "array": lambda t: np.asarray(t).tobytes().hex(),
    "dlpack": lambda t: np.from_dlpack(t).tobytes().hex(),
    "to_dlpack": lambda t: _from_capsule(torch.utils.dlpack.to_dlpack(t)).numpy().tobytes().hex(),
}


def _from_capsule(capsule):
    return torch.utils.dlpack.from_dlpack(capsule)


def _saved_and_loaded(t, **options):
    buffer = io.BytesIO()
    torch.save(t, buffer, **options)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--paths", default=",".join(READS))
    parser.add_argument("--read-from", type=int, default=3)
    parser.add_argument("--out", default="raw_reads.json")
    args = parser.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
                                  for _ in range(DEPTH)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, target = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    reads_at = {args.read_from + 2 * i: path for i, path in enumerate(paths)}
    losses, read, out_before, errors = [], {}, {}, {}
    for step in range(args.read_from + 2 * len(paths) + 1):
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step in reads_at:
            path = reads_at[step]
            tensors = _state_to_read(model, optimizer, step)
            out_before[path] = sum(_storage(t).nbytes() == 0 for t in tensors)
            try:
                read[path] = [READS[path](t) for t in tensors]
            except Exception as error:   # reported per path; training goes on
                errors[path] = f"{type(error).__name__}: {error}"
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "read": read, "out_before": out_before, "errors": errors}, f)


def _state_to_read(model, optimizer, step: int) -> list:
    """The AdamW state of one linear layer (a different one each read): weight's and bias's."""
    layer = model[(step // 2) % DEPTH][0]
    return [optimizer.state[p][key] for p in (layer.weight, layer.bias) for key in STATE_KEYS]


if __name__ == "__main__":
    main()
