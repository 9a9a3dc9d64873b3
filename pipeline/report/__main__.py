"""`python -m pipeline.report`: `pipeline.report.summary`."""

import sys

from pipeline.report.summary import main

sys.exit(main())
