"""`python -m bench`: the TTFA benchmark's command line (see `bench.cli`)."""

import sys

from .cli import main

sys.exit(main())
