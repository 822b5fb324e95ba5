"""File formats: schemas are generated, readers refuse what they cannot read, writers are atomic."""

import pytest

from teraio.errors import FileFormatError, UsageError
from teraio.formats.common import atomic_write_bytes
from teraio.formats.schema_gen import SCHEMA_DIR, render_schemas
from teraio.formats.trace import load_trace, save_trace, trace_to_file
from teraio.units import format_bytes, parse_size

TRACES = SCHEMA_DIR.parent / "traces"


def test_committed_schemas_are_current():
    for name, text in render_schemas().items():
        committed = SCHEMA_DIR / name
        assert committed.exists() and committed.read_text() == text, (
            f"schemas/{name} is stale: run python -m teraio.formats.schema_gen")


@pytest.mark.parametrize("name", ["cpu-tiny.msgpack", "h200-1b-bf16.msgpack"])
def test_committed_traces_load_and_round_trip(name, tmp_path):
    trace = load_trace(TRACES / name)
    assert trace.num_kernels == trace.header.num_kernels > 0
    save_trace(trace_to_file(trace), tmp_path / "copy.msgpack")
    assert (tmp_path / "copy.msgpack").read_bytes() == (TRACES / name).read_bytes()


def test_atomic_write_leaves_nothing_behind_on_failure(tmp_path):
    with pytest.raises(UsageError):
        atomic_write_bytes(tmp_path / "missing" / "x.json", b"{}")
    atomic_write_bytes(tmp_path / "x.json", b"{}")
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_wrong_kind_of_file_is_named(tmp_path):
    (tmp_path / "plan.json").write_text('{"header": {"format": "teraio-plan", "schema_version": 1}}')
    with pytest.raises(FileFormatError, match="is a teraio-plan file, not a teraio-trace file"):
        load_trace(tmp_path / "plan.json")


def test_a_truncated_or_damaged_trace_is_called_so_not_foreign(tmp_path):
    data = (TRACES / "cpu-tiny.msgpack").read_bytes()
    (tmp_path / "cut.msgpack").write_bytes(data[:-1])
    with pytest.raises(FileFormatError, match="is damaged or truncated"):
        load_trace(tmp_path / "cut.msgpack")
    (tmp_path / "foreign.msgpack").write_bytes(b"\x93\x01\x02\x03")
    with pytest.raises(FileFormatError, match="is not a TeraIO file"):
        load_trace(tmp_path / "foreign.msgpack")


def test_a_trace_with_impossible_values_is_refused(tmp_path):
    trace = load_trace(TRACES / "cpu-tiny.msgpack")
    trace.duration_us[3] = float("nan")
    save_trace(trace_to_file(trace), tmp_path / "nan.msgpack")
    with pytest.raises(FileFormatError, match="kernel time is not a finite number"):
        load_trace(tmp_path / "nan.msgpack")


@pytest.mark.parametrize("text,nbytes", [("40GiB", 40 * 2**30), ("40GB", 40 * 10**9), ("512", 512),
                                         ("1.5 MiB", 3 * 2**19), ("1.7GiB", int(1.7 * 2**30))])
def test_sizes(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["-1GB", "forty", "10XB", "", "1.5"])
def test_bad_sizes_say_how_to_write_one(text):
    with pytest.raises(UsageError):
        parse_size(text)


@pytest.mark.parametrize("nbytes,text", [(1000 * 2**20, "1000 MiB"), (1023 * 2**10, "1023 KiB"),
                                         (3 * 2**29, "1.5 GiB"), (512, "512 B")])
def test_sizes_print_without_exponents(nbytes, text):
    assert format_bytes(nbytes) == text
