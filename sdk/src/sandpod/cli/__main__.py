"""``python -m sandpod.cli``."""

import sys

from sandpod.cli import main

sys.exit(main())
