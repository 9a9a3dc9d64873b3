"""`python -m pipeline.demo`: see `pipeline.demo`."""

import sys

from pipeline.demo.cli import main

sys.exit(main())
