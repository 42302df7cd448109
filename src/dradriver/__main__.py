"""`python -m dradriver` is the same as the `dradriver` console script."""

import sys

from dradriver.cli import main

sys.exit(main())
