"""Print this rank's launch environment as one JSON line."""
import json
import os

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "DTORCH_RDZV_TOKEN",
        "DTORCH_RESTART_COUNT", "DTORCH_BACKEND", "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
print("ENV " + json.dumps({k: os.environ.get(k) for k in KEYS}),
      flush=True)
