"""Reading, writing and identifying TeraIO files."""

import errno
import json
import os
import secrets
from pathlib import Path

import msgpack
from pydantic import BaseModel, ConfigDict, ValidationError

from teraio.errors import FileFormatError, UsageError
from teraio.units import SIZE_WITH_A_SPACE, is_size_unit

TRACE_FORMAT = "teraio-trace"
PLAN_FORMAT = "teraio-plan"
REPORT_FORMAT = "teraio-report"
KNOWN_FORMATS = (TRACE_FORMAT, PLAN_FORMAT, REPORT_FORMAT)


class Strict(BaseModel):
    """Base for file models: unknown keys are an error, so typos never pass silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Producer(Strict):
    teraio: str
    torch: str | None = None
    cuda: str | None = None
    kvikio: str | None = None


OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)   # a write the disk (or a quota, a size limit) refused


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temp file beside `path`, then rename: a failure never leaves a half file, and
    an existing file stays as it was."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"cannot write {path}: folder {directory} does not exist; create it first")
    tmp = directory / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        # 0o666 under the umask, as open() makes files: mkstemp's 0600 kept every trace, plan
        # and report from the colleagues they are shared with
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}; choose a writable path") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except OSError as err:  # a full disk: one line, not a traceback
        tmp.unlink(missing_ok=True)
        remedy = "free space or write elsewhere" if err.errno in OUT_OF_SPACE else "choose a writable path"
        raise UsageError(f"cannot write {path}: {err.strerror}, so nothing was written there; {remedy}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def refuse_overwriting_input(output: str | Path, inputs, option: str) -> None:
    """An output that names one of the command's own inputs would replace it: `teraio plan -o`
    given the trace's name lost the trace to its plan, `--report` given the plan's lost the
    plan, and `teraio profile -o train.py` the script itself."""
    if not os.path.exists(output):
        return
    for given in inputs:  # os.path.exists: an argument too long for a file name is no file
        if os.path.exists(given) and os.path.samefile(output, given):
            raise UsageError(f"{option} {output} is also an input ({given}), which writing it would replace: "
                             "give another file name")


HEADER_PROBE_BYTES = 512   # a header's format name ("teraio-trace") lies within its first bytes


def read_raw(path: str | Path) -> dict:
    """The decoded top-level object of any TeraIO file (msgpack or JSON), unvalidated."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        hint = f" ({SIZE_WITH_A_SPACE.format(unit=path)})" if is_size_unit(str(path)) else ""
        raise FileFormatError(f"{path} does not exist: check the path{hint}") from None
    except IsADirectoryError:
        raise FileFormatError(f"{path} is a folder: give a trace, plan or report file") from None
    except OSError as err:
        raise FileFormatError(f"cannot read {path}: {err.strerror}") from None
    obj = _decode(data)
    if obj is None and b"teraio-" in data[:HEADER_PROBE_BYTES]:  # the header's format name, near the start
        raise FileFormatError(f"{path} is damaged or truncated (it does not decode past its header): "
                              "regenerate it, or copy it again if it was copied")
    if not isinstance(obj, dict) or not isinstance(obj.get("header"), dict):
        raise FileFormatError(
            f"{path} is not a TeraIO file (no header): give a file written by teraio profile, plan or run"
        )
    return obj


def _decode(data: bytes):
    if data[:1] == b"{":
        try:
            return json.loads(data)
        except ValueError:
            return None
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.UnpackException):
        return None  # truncated or foreign: reported by the caller as "not a TeraIO file"


def detect_format(raw: dict, path: str | Path) -> str:
    fmt = raw["header"].get("format")
    if fmt not in KNOWN_FORMATS:
        raise FileFormatError(f"{path} is not a TeraIO file (format {fmt!r}): give a trace, plan or report")
    return fmt


def check_version(raw: dict, path, expected_format: str, supported: tuple[int, ...]) -> int:
    """The file's schema version, or FileFormatError that says what to do."""
    fmt = detect_format(raw, path)
    if fmt != expected_format:
        raise FileFormatError(f"{path} is a {fmt} file, not a {expected_format} file: give the right file")
    version = raw["header"].get("schema_version")
    if version not in supported:
        raise FileFormatError(
            f"{path} has {expected_format} schema version {version!r}, but this teraio reads "
            f"version {', '.join(map(str, supported))}: upgrade teraio or regenerate the file"
        )
    return version


def validate(model: type[BaseModel], obj, path) -> BaseModel:
    try:
        return model.model_validate(obj)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise FileFormatError(f"{path} is damaged ({where}: {first['msg']}): regenerate it") from None
