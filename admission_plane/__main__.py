"""``python -m admission_plane``: the same command line as ``admission-plane``."""

import sys

from .cli import main

sys.exit(main())
