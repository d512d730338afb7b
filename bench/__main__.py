"""`python -m bench`: the TTFA benchmark's command line, `realtime-ming bench` (see `realtime_ming.bench`)."""

import sys

from realtime_ming.bench.cli import main

sys.exit(main())
