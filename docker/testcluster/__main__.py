"""`python docker/testcluster ...`: run the package's CLI with docker/ on the import path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testcluster.cli import main  # noqa: E402

sys.exit(main())
