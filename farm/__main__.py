"""`python -m farm ...`: the `farm` command where the console script is not on PATH (e.g. `ray job submit`)."""

import sys

from farm.cli import main

sys.exit(main())
