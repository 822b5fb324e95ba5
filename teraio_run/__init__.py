"""Stage 3: execute a plan inside the unmodified training job (see agent.py and engine.py)."""
