"""``python -m checkpointd`` is the ``checkpointd`` command."""

import sys

from .cli import main

sys.exit(main())
