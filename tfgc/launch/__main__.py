"""`python -m tfgc.launch`."""

import sys

from tfgc.launch.cli import main

sys.exit(main())
