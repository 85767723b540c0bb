"""Prints the GPUs the rank was given (CUDA_VISIBLE_DEVICES) as JSON; imports no torch."""

import json
import os

print(json.dumps({"rank": int(os.environ["RANK"]), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
