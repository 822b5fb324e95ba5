"""JSON Schemas of the three file formats, generated from their pydantic models.

    python -m teraio.formats.schema_gen          # rewrite schemas/*.json
A test regenerates them and fails when the committed ones are stale.
"""

import json
from pathlib import Path

from teraio.formats.plan import PLAN_SCHEMA_VERSION, Plan
from teraio.formats.report import REPORT_SCHEMA_VERSION, RunReport
from teraio.formats.trace import TRACE_SCHEMA_VERSION, TraceFile

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
MODELS = {
    f"trace.v{TRACE_SCHEMA_VERSION}.json": TraceFile,
    f"plan.v{PLAN_SCHEMA_VERSION}.json": Plan,
    f"report.v{REPORT_SCHEMA_VERSION}.json": RunReport,
}


def render_schemas() -> dict[str, str]:
    return {name: json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"
            for name, model in MODELS.items()}


def write_schemas(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(exist_ok=True)
    paths = []
    for name, text in render_schemas().items():
        (directory / name).write_text(text)
        paths.append(directory / name)
    return paths


if __name__ == "__main__":
    for path in write_schemas():
        print(path)
