"""Run the bundled example (teraio/examples/train_gpt.py) from a checkout, without importing teraio."""
import os, runpy  # noqa: E401
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "teraio", "examples", "train_gpt.py"), run_name="__main__")
