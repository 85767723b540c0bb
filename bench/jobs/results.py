"""The pull benchmark's job (stdlib only): every rank writes what a training run leaves behind, then ends.

  outputs/model.bin         --mb MB of random bytes (a checkpoint: incompressible)
  outputs/logs/NN/K.txt     --files small files of 1-4 KB (metrics, event files, logs)
"""

import argparse
import os
import random

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, required=True)
p.add_argument("--world-size", type=int, required=True)
p.add_argument("--mb", type=int, default=100)
p.add_argument("--files", type=int, default=1000)
a = p.parse_args()

rng = random.Random(os.urandom(8))
os.makedirs("outputs", exist_ok=True)
with open("outputs/model.bin", "wb") as fh:
    for _ in range(a.mb):
        fh.write(os.urandom(1 << 20))
alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 _=.,\n"
for i in range(a.files):
    folder = os.path.join("outputs", "logs", "%02d" % (i // 100))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "%d.txt" % i), "w") as fh:
        fh.write("".join(rng.choices(alphabet, k=rng.randint(1024, 4096))))
