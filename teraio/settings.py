"""Every TERAIO_* environment variable, in one place.

The launchers (`teraio profile`, `teraio run`) set these; the agent inside each training
process (every torchrun rank inherits them) reads them. docs/settings.md is the user table,
and a test checks that it names every field here.
"""

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

PREFIX = "TERAIO_"
# The command travels to the job for the headers as one environment string, and Linux takes
# one of at most 128 KiB (MAX_ARG_STRLEN): a job given 20k arguments, which ran plainly, did
# not start under teraio ("Argument list too long"). Past this its tail is counted, not kept.
COMMAND_ENV_CHARS = 16 << 10


@dataclass
class Settings:
    mode: str = ""                       # "profile" or "run"; empty: the bootstrap does nothing
    device: str = "auto"                 # "auto" (cuda if available), "cuda" or "cpu"
    command: list[str] = field(default_factory=list)  # the launched command, for headers
    status_dir: str = ""                 # where each process says how far it got
    strict: bool = False                 # fail the job instead of training on without the agent or the plan
    # profile
    trace_out: str = "trace.msgpack"
    warmup: int = 1                      # iterations skipped before the recorded one
    iterations: int = 2                  # iterations profiled (kernel times are their median)
    run_to_completion: bool = False      # keep training after the profile is written
    steps_per_iteration: int = 0         # optimizer steps per iteration (0 = find the cycle)
    step_timeout_s: int = 300            # stop a job with no optimizer step this long after its first op (0 = never)
    host_mem_bytes: int = 0              # host pool when profiling under a cap (gpu_mem_bytes)
    # run, and profile under a cap
    gpu_mem_bytes: int = 0               # device memory cap (run: 0 = the plan's budget, on CUDA; profile: 0 = none)
    ssd_dirs: list[str] = field(default_factory=list)
    io_backend: str = "auto"             # "auto", "kvikio" or "posix"
    # run
    plan: str = ""                       # plan file (per-rank: path with .rankN inserted)
    report: str = ""                     # run report path ("" = no file, summary only)
    clean_copies: bool = True            # release unwritten storages without copying (Note [Clean copies])
    # set by torchrun, not by us
    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls, env=None) -> "Settings":
        env = os.environ if env is None else env
        values = {}
        for f in fields(cls):
            raw = env.get(PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f.type, raw)
        values["rank"] = int(env.get("RANK", values.get("rank", 0)))
        values["world_size"] = int(env.get("WORLD_SIZE", values.get("world_size", 1)))
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        env = {}
        for f in fields(self):
            if f.name in ("rank", "world_size"):
                continue
            value = getattr(self, f.name)
            if f.name == "command":
                value = _recorded_command(value)
            env[PREFIX + f.name.upper()] = json.dumps(value) if isinstance(value, list) else str(value)
        return env

    def device_type(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


def _recorded_command(argv: list[str]) -> list[str]:
    """The arguments that fit in COMMAND_ENV_CHARS of JSON, then how many more there were."""
    kept, chars = [], 0
    for i, arg in enumerate(argv):
        chars += len(json.dumps(arg)) + 2
        if chars > COMMAND_ENV_CHARS:
            return kept + [f"... ({len(argv) - i} more arguments)"]
        kept.append(arg)
    return kept


def _parse(type_name, raw: str):
    kind = type_name if isinstance(type_name, str) else type_name.__name__
    if kind.startswith("list"):
        return json.loads(raw)
    if kind == "bool":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind == "int":
        return int(raw)
    return raw


def rank_path(path: str | Path, rank: int, world_size: int) -> Path:
    """trace.msgpack -> trace.rank1.msgpack when the job has several ranks."""
    path = Path(path)
    if world_size <= 1:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def status_path(status_dir: str) -> Path | None:
    if not status_dir:
        return None
    return Path(status_dir) / f"status.{os.getpid()}.json"
