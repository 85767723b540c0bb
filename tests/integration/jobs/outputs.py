"""The job of tests/integration/test_around_run_cluster.py (stdlib only): writes results as a training job does,
and can serve its folder over HTTP on rank 0's host (as TensorBoard would).

  every rank        outputs/r<rank>.txt ("rank R of N on HOST")
  rank 0            outputs/model.pt (--model-mb MB of random bytes), outputs/big.bin (--big-mb MB)
  --serve PORT      rank 0 serves its job folder on localhost:PORT until a file named stop-serving appears
  --sleep S         then sleeps S seconds
"""

import argparse
import functools
import http.server
import os
import socket
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, required=True)
p.add_argument("--world-size", type=int, required=True)
p.add_argument("--model-mb", type=int, default=4)
p.add_argument("--big-mb", type=int, default=0)
p.add_argument("--serve", type=int, default=0)
p.add_argument("--sleep", type=float, default=0)
a = p.parse_args()

os.makedirs("outputs", exist_ok=True)
with open(f"outputs/r{a.rank}.txt", "w") as fh:
    fh.write(f"rank {a.rank} of {a.world_size} on {socket.gethostname()}\n")
if a.rank == 0:
    for name, mb in (("model.pt", a.model_mb), ("big.bin", a.big_mb)):
        if mb:
            with open(f"outputs/{name}.tmp", "wb") as fh:
                for _ in range(mb):
                    fh.write(os.urandom(1 << 20))
            os.replace(f"outputs/{name}.tmp", f"outputs/{name}")
if a.serve and a.rank == 0:
    with open("page.bin", "wb") as fh:
        fh.write(os.urandom(2 << 20))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=".")
    server = http.server.ThreadingHTTPServer(("localhost", a.serve), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"serving on localhost:{a.serve}", flush=True)
    while not os.path.exists("stop-serving"):
        time.sleep(0.1)
    server.shutdown()
time.sleep(a.sleep)
print(f"rank {a.rank} done", flush=True)
