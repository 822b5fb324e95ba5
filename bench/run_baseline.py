"""Run one configuration of one system and write a JSON result (issue 5).

    python bench/run_baseline.py --system ideal --preset 3b --dtype fp32 --out results.jsonl
    python bench/run_baseline.py --system zero_offload --preset 3b --gpu-mem 50GiB --out r.jsonl
    python bench/run_baseline.py --system ideal --preset 3b --profile-trace 3b.msgpack   # for teraio plan
    python bench/run_baseline.py --system teraio_mixed --plan 3b-2x.json --gpu-mem 50GiB --out r.jsonl

Systems: ideal (plain, uncapped), plain_capped, zero_offload (DeepSpeed stage 2, optimizer on
CPU, cpu_adam), zero_infinity (stage 3, parameters and optimizer on NVMe via async_io),
checkpointing (torch.utils.checkpoint around every decoder layer), save_on_cpu
(torch.autograd.graph.save_on_cpu, pinned on CUDA), and teraio_host / teraio_ssd / teraio_mixed:
the ideal's training loop under `teraio run --plan PLAN` (the plan says which tiers it uses;
the name says which the plan was made for). --profile-trace records the ideal's loop with
`teraio profile` instead of measuring it, so plans come from the very loop they run. The
model, data and optimizer come from teraio/examples/train_gpt.py; every system trains the
same model, batch and seed, with a constant learning rate.

The run happens in a child process under a timeout, so an out-of-memory error, a missing
DeepSpeed build, a crash or a hang still yields a result with status "failed" and the error
line. --out FILE writes one JSON object; a FILE ending in .jsonl gets one line appended.
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TERAIO_SYSTEMS = ("teraio_host", "teraio_ssd", "teraio_mixed")
SYSTEMS = ("ideal", "plain_capped", "zero_offload", "zero_infinity", "checkpointing", "save_on_cpu", *TERAIO_SYSTEMS)
RESULT_FORMAT, RESULT_VERSION = "teraio-bench-result", 1
SHAPE_KEYS = ("layers", "dim", "heads", "ffn", "vocab", "seq", "batch")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--preset", default="tiny", help="a train_gpt.py preset: tiny, 1b, 3b")
    for key in SHAPE_KEYS:
        p.add_argument(f"--{key}", type=int, help=f"overrides the preset's {key}")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="fp32: fp32 weights and math (TF32 matmuls unless --no-tf32); bf16: bf16 autocast")
    p.add_argument("--no-tf32", action="store_true", help="full fp32 matmuls on CUDA")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels, so systems' losses compare bit for bit")
    p.add_argument("--gpu-mem", help="per-process device memory cap, e.g. 50GiB (set_per_process_memory_fraction)")
    p.add_argument("--warmup", type=int, default=3, help="steps run before measuring")
    p.add_argument("--steps", type=int, default=10, help="measured steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--nvme-dir", default="/tmp/ds_nvme", help="zero_infinity swap folder (one disk = one SSD)")
    p.add_argument("--act-ckpt", action="store_true",
                   help="also checkpoint every decoder layer (e.g. zero_offload+ckpt); recorded in the system name")
    p.add_argument("--plan", help="teraio_*: the plan from `teraio plan`, made for this --gpu-mem")
    p.add_argument("--ssd-dir", default="/tmp/teraio-swap", help="teraio_*: swap folder (one disk = one SSD)")
    p.add_argument("--profile-trace", metavar="TRACE",
                   help="ideal only: write a teraio trace of this loop (2 profiled iterations after --warmup); "
                        "no result is written")
    p.add_argument("--profile-cap", metavar="SIZE",
                   help="with --profile-trace: profile under this device cap (teraio profile --gpu-mem), "
                        "tensors evicted to a --profile-host-mem pool and --ssd-dir")
    p.add_argument("--profile-host-mem", default="72GiB", help="with --profile-cap: the host pool")
    p.add_argument("--cprofile", metavar="STATS",
                   help="run the child under cProfile and write its stats here (slows Python code: "
                        "the result is for finding host time, not for the table)")
    p.add_argument("--py-spy", metavar="STACKS",
                   help="sample the child with py-spy (500 Hz, waits included) and write its collapsed "
                        "stacks here; bench/spy_summary.py reads them (barely slows the job)")
    p.add_argument("--memory-history", metavar="PICKLE",
                   help="CUDA: record the allocator's history over one more step after the measured ones "
                        "and write its snapshot here (bench/alloc_trace.py reads it)")
    p.add_argument("--skip", metavar="REASON", help="write a 'skipped' result with this reason, run nothing")
    p.add_argument("--label", help="free text kept in the result, e.g. 'cap 1/2 of ideal'")
    p.add_argument("--timeout-s", type=float, default=600, help="the child run is killed after this")
    p.add_argument("--out", help="result file: .json (written) or .jsonl (appended); not with --profile-trace")
    p.add_argument("--child", help=argparse.SUPPRESS)  # internal: the child writes its result here
    args = p.parse_args(argv)
    if args.system == "ideal" and args.gpu_mem:
        p.error("the ideal run is uncapped: use --system plain_capped for plain PyTorch under a cap")
    if args.system in ("plain_capped", *TERAIO_SYSTEMS) and not args.gpu_mem:
        p.error(f"{args.system} needs --gpu-mem")
    if (args.system in TERAIO_SYSTEMS) != bool(args.plan) and not args.skip:
        p.error("--plan goes with, and only with, the teraio_* systems")
    if args.plan and not args.skip and not Path(args.plan).is_file():
        p.error(f"--plan {args.plan} does not exist: make it with `teraio plan`")
    if args.profile_trace and args.system != "ideal":
        p.error("--profile-trace records the ideal loop: use it with --system ideal")
    if args.profile_cap and not args.profile_trace:
        p.error("--profile-cap goes with --profile-trace")
    if not args.out and not args.profile_trace and not args.child:
        p.error("--out is required: the result file (.json or .jsonl)")
    return args


# ----------------------------------------------------------------------------- child side

def model_config(args):
    from teraio.examples.train_gpt import PRESETS, ModelConfig

    if args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}: use one of {', '.join(PRESETS)}")
    shape = {k: getattr(args, k) if getattr(args, k) is not None else PRESETS[args.preset][k] for k in SHAPE_KEYS}
    batch = shape.pop("batch")
    return ModelConfig(**shape), batch


def pick_device(choice):
    import torch

    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", torch.cuda.current_device()) if choice == "cuda" else torch.device("cpu")


def apply_cap(args, device):
    """The same cap as teraio's --gpu-mem: a fraction of the device's total memory."""
    import torch

    if not args.gpu_mem:
        return None
    if device.type != "cuda":
        raise RuntimeError("--gpu-mem needs a CUDA device: run on the GPU machine or drop the cap")
    from teraio.units import parse_size

    cap_bytes = parse_size(args.gpu_mem)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), device)
    return cap_bytes


def checkpoint_layer(layer):
    """Recompute this decoder layer's activations in backward (names stay unchanged)."""
    from torch.utils.checkpoint import checkpoint

    inner = layer.forward
    layer.forward = lambda x, cos, sin: checkpoint(inner, x, cos, sin, use_reentrant=False)


def ds_config(args, batch, max_numel):
    common = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
              "gradient_clipping": args.clip, "steps_per_print": 10**9, "bf16": {"enabled": False},
              "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                         "weight_decay": 0.1}}}
    if args.system == "zero_offload":
        # 2e8-element buckets (800 MB fp32) instead of the 5e8 default: the defaults alone
        # would take several GB of a capped device.
        zero = {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "contiguous_gradients": True, "overlap_comm": True,
                "reduce_bucket_size": int(2e8), "allgather_bucket_size": int(2e8)}
        return {**common, "zero_optimization": zero}
    # The parameters ZeRO-3 keeps live (max_live, max_reuse) must fit in the NVMe swap buffers
    # (buffer_count x buffer_size elements) with room for the prefetch: with the common
    # 5 x 1e8 against 1e9 live, the 3B run died in its second step with "Not enough buffers
    # 0 for swapping 1" (2026-11-29; DeepSpeed issue 3062).
    nvme = {"device": "nvme", "nvme_path": args.nvme_dir, "pin_memory": True}
    buffer_numel = int(max(1e8, max_numel))
    zero = {"stage": 3, "offload_param": {**nvme, "buffer_count": 8, "buffer_size": buffer_numel},
            "offload_optimizer": {**nvme, "buffer_count": 4}, "sub_group_size": int(1e8),
            "stage3_prefetch_bucket_size": int(5e7), "stage3_param_persistence_threshold": int(1e5),
            "stage3_max_live_parameters": 5 * buffer_numel, "stage3_max_reuse_distance": 5 * buffer_numel}
    aio = {"block_size": 1 << 20, "queue_depth": 8, "thread_count": 1, "single_submit": False,
           "overlap_events": True}
    return {**common, "zero_optimization": zero, "aio": aio}


def single_process_env():
    """DeepSpeed wants a process group even for one GPU: a one-rank one on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port)).items():
        os.environ.setdefault(key, value)


def build_deepspeed(args, cfg, batch, device, info):
    import deepspeed
    import torch

    from teraio.examples.train_gpt import GPT

    info["deepspeed"] = deepspeed.__version__
    single_process_env()
    with torch.device("meta"):
        max_numel = max(p.numel() for p in GPT(cfg).parameters())
    config = ds_config(args, batch, max_numel)
    info["system_config"] = config
    if args.system == "zero_infinity":
        os.makedirs(args.nvme_dir, exist_ok=True)
        # zero.Init partitions each parameter to NVMe as its module is built, so the whole
        # model never sits on the device; weights keep torch's default init there.
        with deepspeed.zero.Init(config_dict_or_path=config, remote_device="nvme", pin_memory=True):
            model = GPT(cfg)
    else:
        with torch.device(device):
            model = GPT(cfg)
    if args.act_ckpt:
        for layer in model.model.layers:
            checkpoint_layer(layer)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    def step(x, y, autocast):
        with autocast:
            loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        return loss

    return step


def build_plain(args, cfg, device, info):
    import torch

    from teraio.examples.train_gpt import build_model, make_optimizer

    model = build_model(cfg, device)
    if args.system == "checkpointing" or args.act_ckpt:
        for layer in model.model.layers:
            checkpoint_layer(layer)
    optimizer = make_optimizer(model, args.lr, device)
    pin = device.type == "cuda"
    info["system_config"] = {"save_on_cpu_pin_memory": pin} if args.system == "save_on_cpu" else {}

    def step(x, y, autocast):
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            if args.system == "save_on_cpu":
                with torch.autograd.graph.save_on_cpu(pin_memory=pin):
                    loss = model(x, y)
            else:
                loss = model(x, y)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        return loss

    return step


def host_rss():
    """(current, peak) resident set size of this process in bytes, from /proc."""
    fields = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return fields.get("VmRSS"), fields.get("VmHWM")


def device_peaks(device):
    import torch

    if device is None or device.type != "cuda":
        return {"peak_device_bytes": None, "peak_device_reserved_bytes": None}
    return {"peak_device_bytes": torch.cuda.max_memory_allocated(device),
            "peak_device_reserved_bytes": torch.cuda.max_memory_reserved(device)}


def summarize(step_ms, tokens_per_step):
    ordered = sorted(step_ms)

    def pct(q):
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    median = statistics.median(step_ms)
    return {"tokens_per_s": tokens_per_step / (median / 1e3), "step_ms_median": median,
            "step_ms_p10": pct(0.1), "step_ms_p90": pct(0.9), "step_ms_min": ordered[0],
            "step_ms_max": ordered[-1], "step_ms_stdev": statistics.pstdev(step_ms), "step_ms": step_ms}


def train(args, info, metrics):
    """Set up the system and run warm-up + measured steps; fills info/metrics as it goes."""
    import torch

    from teraio.examples.train_gpt import SyntheticTokens

    cfg, batch = model_config(args)
    device = pick_device(args.device)
    info["device"] = device
    if args.system not in TERAIO_SYSTEMS:  # teraio run sets the same cap itself (and a budget on CPU)
        metrics["gpu_mem_cap_bytes"] = apply_cap(args, device)
    if args.deterministic:
        from teraio.examples.train_gpt import make_deterministic

        make_deterministic()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = not args.no_tf32
        torch.backends.cudnn.allow_tf32 = not args.no_tf32
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    if args.system.startswith("zero_"):
        step = build_deepspeed(args, cfg, batch, device, info)
    else:
        step = build_plain(args, cfg, device, info)
    metrics["setup_s"] = time.perf_counter() - t0
    data = SyntheticTokens(cfg.vocab, cfg.seq, batch, args.seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step_ms, losses = [], []
    for i in range(args.warmup + args.steps):
        info["phase"] = f"step {i + 1}" + (" (warm-up)" if i < args.warmup else "")
        sync()
        t0 = time.perf_counter()
        x, y = data.next(device)
        losses.append(step(x, y, autocast).item())  # .item() waits for the step's last kernel
        sync()
        if i >= args.warmup:
            step_ms.append((time.perf_counter() - t0) * 1e3)
    metrics.update(summarize(step_ms, batch * cfg.seq), losses=losses)
    if args.memory_history and device.type == "cuda":
        info["phase"] = "the step under the allocator's history"
        record_allocator_history(lambda: step(*data.next(device), autocast).item(), args.memory_history)


def record_allocator_history(run_step, out_path):
    """One step with the CUDA allocator recording every alloc, free, segment map and unmap
    (Python stacks at each alloc, to say who asked); outside the measured steps because
    recording slows the allocator."""
    import pickle

    import torch

    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=2_000_000)
    run_step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(out_path, "wb") as f:
        pickle.dump(snapshot, f)


def run_child(args):
    info, metrics = {"phase": "setup"}, {}
    result = {"status": "ok", "error": None, "failed_at": None}
    try:
        train(args, info, metrics)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a result row
        if not isinstance(exc, SystemExit):  # teraio profile ends the script so when done
            traceback.print_exc()  # the whole story for the log; the result keeps one line
        first_line = (str(exc).strip().splitlines() or [""])[0]
        result.update(status="failed", error=f"{type(exc).__name__}: {first_line}"[:500],
                      failed_at=info["phase"])
    if "device" in info:  # torch imported: a failed first import (e.g. a --strict agent) must not be retried
        metrics.update(device_peaks(info["device"]))
    metrics["host_rss_bytes"], metrics["host_rss_peak_bytes"] = host_rss()
    result.update(metrics=metrics, system_config=info.get("system_config"), env=child_env(info))
    Path(args.child).write_text(json.dumps(result))


def child_env(info):
    env = {"python": platform.python_version(), "deepspeed": info.get("deepspeed")}
    try:
        import torch

        env.update(torch=torch.__version__, cuda=torch.version.cuda)
        device = info.get("device")
        if device is not None and device.type == "cuda":
            env.update(device_name=torch.cuda.get_device_name(device),
                       device_total_bytes=torch.cuda.get_device_properties(device).total_memory)
        else:
            env.update(device_name=f"cpu ({platform.processor() or platform.machine()})", device_total_bytes=None)
    except Exception:  # noqa: BLE001 - a result must still be written
        pass
    return env


# ---------------------------------------------------------------------------- parent side

def git_commit():
    """TERAIO_COMMIT first: the GPU machine's copy of the tree may carry a stale .git."""
    if os.environ.get("TERAIO_COMMIT"):
        return os.environ["TERAIO_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout.strip()
    except OSError:
        pass
    return "unknown"


def code_sha256():
    """Which code ran, also where .git does not travel (the GPU machine)."""
    h = hashlib.sha256()
    for rel in ("bench/run_baseline.py", "teraio/examples/train_gpt.py"):
        h.update((ROOT / rel).read_bytes())
    return h.hexdigest()[:16]


def echo_lines(stream, tail):
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()
        tail.append(line.rstrip())


def teraio_wrapper(args, report_path):
    """The `teraio profile` / `teraio run` command line the child runs under, if any."""
    teraio = [sys.executable, "-m", "teraio"]
    if args.profile_trace:
        cap = ["--gpu-mem", args.profile_cap, "--host-mem", args.profile_host_mem, "--ssd-dir", args.ssd_dir]
        return [*teraio, "profile", "-o", args.profile_trace, "--warmup", str(args.warmup), "--iterations", "2",
                *(cap if args.profile_cap else []), "--"]
    if args.system in TERAIO_SYSTEMS:
        return [*teraio, "run", "--plan", args.plan, "--gpu-mem", args.gpu_mem, "--ssd-dir", args.ssd_dir,
                "--report", report_path, "--strict", "--"]
    return []


def run_supervised(argv, args):
    """Runs the child under the timeout; returns (child result or None, rc, last output lines, report path)."""
    fd, result_path = tempfile.mkstemp(suffix=".json", prefix="bench-")
    os.close(fd)
    report_path = result_path.replace(".json", ".report.json")
    python = [sys.executable, *(["-m", "cProfile", "-o", args.cprofile] if args.cprofile else [])]
    if args.py_spy:
        python = ["py-spy", "record", "--rate", "500", "--idle", "--format", "raw", "-o", args.py_spy, "--", *python]
    cmd = [*teraio_wrapper(args, report_path), *python, str(Path(__file__).resolve()), *argv,
           "--child", result_path]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               PYTHONUNBUFFERED="1")
    tail = deque(maxlen=40)
    # Own process group: a timeout must also end the compilers DeepSpeed may have started.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    reader = threading.Thread(target=echo_lines, args=(proc.stdout, tail), daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = "timeout"
    reader.join(timeout=5)
    text = Path(result_path).read_text()
    os.unlink(result_path)
    try:
        child = json.loads(text) if text else None  # written before a hang at exit still counts
    except ValueError:  # cut off mid-write by the timeout
        child = None
    return child, rc, list(tail), report_path


def failed_without_result(rc, tail, timeout_s):
    if rc == "timeout":
        return {"status": "failed", "error": f"timeout: no result within {timeout_s:.0f} s", "failed_at": "timeout"}
    errors = [line for line in tail if "Error" in line or "error" in line] or tail or [""]
    return {"status": "failed", "error": f"exit code {rc}: {errors[-1]}"[:500], "failed_at": "exit"}


def teraio_metrics(args, report_path):
    """(metrics, system config): what the teraio run report and its plan say about the
    measured steps (issue 5's columns), and the planner inputs the run was planned with."""
    from teraio.formats.plan import load_plan
    from teraio.formats.report import load_report

    plan = load_plan(args.plan).header
    found = {"predicted_step_ms": plan.prediction.iteration_ms, "teraio": {"plan": plan.prediction.model_dump()}}
    system_config = {"plan": Path(args.plan).name, "ssd_dir": args.ssd_dir, **plan.inputs.model_dump()}
    if not Path(report_path).exists():
        return found, system_config
    report = load_report(report_path)
    Path(report_path).unlink()
    measured = [row for row in report.per_iteration if args.warmup <= row.iteration < args.warmup + args.steps]
    found["stall_ms"] = statistics.mean(row.stall_ms for row in measured) if measured else None
    found["bytes_moved"] = {f"{direction}_{tier}": n for direction, by_tier in
                            (("out", report.offloaded_bytes), ("in", report.prefetched_bytes))
                            for tier, n in by_tier.items()}
    found["teraio"].update(report.model_dump(mode="json", exclude={"header"}))
    return found, system_config


def build_result(args, child, rc, tail, report_path=None):
    result = child or failed_without_result(rc, tail, args.timeout_s)
    metrics = result.pop("metrics", {}) or {}
    if args.system in TERAIO_SYSTEMS and not args.skip:
        found, result["system_config"] = teraio_metrics(args, report_path)
        metrics.update(found)
    env = result.pop("env", {}) or {}
    from teraio.examples.train_gpt import count_params
    from teraio.units import parse_size

    cfg, batch = model_config(args)
    metrics.pop("gpu_mem_cap_bytes", None)  # the parent's figure below is the one asked for
    config = {"preset": args.preset, **vars(cfg), "batch": batch, "params": count_params(cfg),
              "dtype": args.dtype, "tf32": not args.no_tf32, "deterministic": args.deterministic,
              "gpu_mem": args.gpu_mem,
              "gpu_mem_cap_bytes": parse_size(args.gpu_mem) if args.gpu_mem else None, "warmup_steps": args.warmup,
              "measured_steps": args.steps, "seed": args.seed, "lr": args.lr, "lr_schedule": "constant",
              "clip": args.clip, "act_ckpt": args.act_ckpt or args.system == "checkpointing",
              "system_config": result.pop("system_config", None),
              "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    env.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               git_commit=git_commit(), code_sha256=code_sha256())
    return {"format": RESULT_FORMAT, "schema_version": RESULT_VERSION, "system": system_name(args),
            "label": args.label, "status": result["status"], "error": result["error"],
            "failed_at": result["failed_at"], "config": config,
            "metrics": {"bytes_moved": None, "stall_ms": None, **metrics}, "env": env}


def system_name(args):
    return f"{args.system}+ckpt" if args.act_ckpt and args.system != "checkpointing" else args.system


def write_result(result, out):
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".jsonl":
        with out.open("a") as f:
            f.write(json.dumps(result, sort_keys=True) + "\n")
    else:
        out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        run_child(args)
        sys.stdout.flush()
        if args.profile_trace or args.system in TERAIO_SYSTEMS:
            return 0  # teraio writes its trace or report (and removes its swap files) at interpreter exit
        # Skip interpreter teardown: a process group or pinned pools left by a failed run can
        # hang at exit, and the result is already on disk.
        os._exit(0)
    if args.skip:
        child, rc, tail, report_path = {"status": "skipped", "error": args.skip, "failed_at": None}, None, [], None
    else:
        child, rc, tail, report_path = run_supervised(argv, args)
    if args.profile_trace:
        ok = rc == 0 and Path(args.profile_trace).exists()
        print(f"[bench] profile {'written to ' + args.profile_trace if ok else f'FAILED (exit {rc})'}", flush=True)
        return 0 if ok else 1
    result = build_result(args, child, rc, tail, report_path)
    write_result(result, args.out)
    m = result["metrics"]
    summary = (f"tok/s {m['tokens_per_s']:.0f} step_ms {m['step_ms_median']:.1f}" if result["status"] == "ok"
               else f"{result['status'].upper()}{' at ' + result['failed_at'] if result['failed_at'] else ''}: "
               f"{result['error']}")
    print(f"[bench] {system_name(args)} {args.preset} {args.dtype} cap={args.gpu_mem or 'none'}: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
