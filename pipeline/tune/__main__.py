"""`python -m pipeline.tune`: `pipeline.tune.tuner`."""

import sys

from pipeline.tune.tuner import main

sys.exit(main())
