"""A rank that leaves a child behind: the child starts a session of its own (out of the rank's process
group, as a daemonized DataLoader worker would) and keeps a stand-in GPU device file open
($STANDIN_DEVICE). With --exit the rank then ends at once; else it sleeps."""

import os
import subprocess
import sys
import time

device = os.environ["STANDIN_DEVICE"]
child = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(300)", device],
                         start_new_session=True)
print(f"left pid {child.pid} holding {device}", flush=True)
if "--exit" not in sys.argv:
    time.sleep(300)
