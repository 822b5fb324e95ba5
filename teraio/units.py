"""Sizes and rates as users type them ("40GiB", "6.5GB", "123456") and as we print them."""

import re

from teraio.errors import UsageError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from "40GiB" / "40GB" / "40e9"-free plain integers; raises UsageError."""
    if isinstance(text, int):
        nbytes = text
    else:
        match = _SIZE_RE.match(str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise UsageError(
                f"cannot read size {text!r}: write a number with an optional unit, "
                "e.g. 40GiB, 512MB or 1073741824"
            )
        exact = float(match.group(1)) * _SIZE_UNITS[unit]
        if _SIZE_UNITS[unit] == 1 and exact != int(exact):  # "1.5" read as 1 B was a one-byte budget
            raise UsageError(f"size {text!r} is not a whole number of bytes: give a unit (e.g. {text}GiB) "
                             "or whole bytes")
        nbytes = int(exact)
    if nbytes < 0:
        raise UsageError(f"size {text!r} is negative: give a size of 0 or more")
    return nbytes


# what to say where a file or a command is named like a unit: `--gpu-mem 6 MiB` read "6" as the
# size and "MiB" as the next argument
SIZE_WITH_A_SPACE = "if {unit} is the unit of a size, write the two together: --gpu-mem 24{unit}, not 24 {unit}"


def is_size_unit(text: str) -> bool:
    """Whether text is a unit alone ("MiB"): what a size typed with a space leaves behind."""
    return bool(text) and text.lower() in _SIZE_UNITS


def format_bytes(nbytes: float) -> str:
    """Binary units, 3 significant digits: 1.50 GiB, 12.0 MiB, 512 B."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            # 100 and up as a whole number: 3 significant digits of 1000-1023 would print "1e+03"
            return f"{value:.0f} {unit}" if unit == "B" or abs(value) >= 100 else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_ms(ms: float) -> str:
    return f"{ms:.3g} ms" if ms < 1000 else f"{ms / 1000:.3g} s"
