"""docs/settings.md is the one table of settings: it must name every variable and option."""

from dataclasses import fields
from pathlib import Path

from teraio.app.cli import cli
from teraio.settings import PREFIX, Settings

DOC = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text()


def test_every_environment_variable_is_documented():
    for f in fields(Settings):
        if f.name not in ("rank", "world_size"):
            assert f"`{PREFIX}{f.name.upper()}`" in DOC, f.name


def test_every_option_is_documented():
    for name in ("profile", "plan", "run"):
        for param in cli.commands[name].params:
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    assert f"{opt}`" in DOC, f"{name} {opt}"
