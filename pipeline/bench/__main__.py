"""`python -m pipeline.bench`: the speed benchmark (`pipeline.bench.speed`)."""

import sys

from pipeline.bench.speed import main

sys.exit(main())
