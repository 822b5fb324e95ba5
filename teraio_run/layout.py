"""Where swap files go, shared by the launcher's preflight and the runtime (no torch here:
`teraio run` checks folders before it starts the job, and importing torch takes seconds)."""

import tempfile
from pathlib import Path

STRIPE_MIN_BYTES = 4 << 20   # smaller tensors go to one SSD: striping them only adds requests
DEFAULT_SWAP_DIR = Path(tempfile.gettempdir()) / "teraio-swap"   # when no --ssd-dir is given
