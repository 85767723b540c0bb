"""The job's Python environment on this host: the base interpreter found (base.py, in the push's facts),
the venv built once per key under WORKDIR/envs (build.py, a step of the held session), and the stack
fingerprint of an interpreter, cached beside it (fingerprint.py)."""
