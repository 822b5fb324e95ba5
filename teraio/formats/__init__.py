"""The versioned files that pass between stages: trace (msgpack), plan and run report (JSON).

Each file starts with a header (format name, integer schema version, producers). Readers
refuse an unknown format or version in one sentence; they never guess a version from the
shape of the data. The pydantic models here generate the JSON Schemas in schemas/.
"""

from teraio.formats.common import detect_format

__all__ = ["detect_format"]
