"""`cat`: a file of the run's job folder (metrics.json, say), raw on stdout; never anything outside it."""

import os
import sys

from ..files import read_capped
from ..paths import job_dir
from ..wire import Fail

CAT_LIMIT = 64 << 20


def cmd_cat(run_dir, rel):
    job = os.path.realpath(job_dir(run_dir))
    path = os.path.realpath(os.path.join(job, rel))
    if not path.startswith(job + os.sep):
        raise Fail("%r is outside the run's job folder" % rel, "protocol")
    try:
        data = read_capped(path, CAT_LIMIT + 1)  # a FIFO the job left there is refused, not waited on
    except OSError as exc:
        raise Fail("cannot read %s: %s" % (rel, exc.strerror), "missing", path) from None
    if len(data) > CAT_LIMIT:
        raise Fail("%s is larger than %d bytes" % (rel, CAT_LIMIT), "too_big", path)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0
