"""How swap files are laid out over the SSD folders, shared by the launcher's preflight and the
runtime (no torch here: `teraio run` checks folders before it starts the job, and importing
torch takes seconds). The folders themselves: teraio/swap_dirs.py."""

STRIPE_MIN_BYTES = 4 << 20   # smaller tensors go to one SSD: striping them only adds requests
