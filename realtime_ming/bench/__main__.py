"""`python -m realtime_ming.bench`: the TTFA benchmark's command line (see `realtime_ming.bench.cli`)."""

import sys

from .cli import main

sys.exit(main())
