"""The benchmarks, each a module run with ``python -m benchmarks.NAME``."""

import os

# The settings a run started with, read before ``turbo_inductor``'s import sets defaults of its own (record.py).
STARTED_WITH = {k: v for k, v in os.environ.items() if k.startswith(("TURBO_INDUCTOR_", "TORCHINDUCTOR_"))}
