"""``python -m sandpod``: the CLI."""

import sys

from sandpod.cli import main

sys.exit(main())
