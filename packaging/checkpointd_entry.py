"""Entry script of the single `checkpointd` executable (PyInstaller runs it as __main__).

The package's own ``__main__`` uses a relative import, which a top-level script cannot.
"""

import sys

from checkpointd.cli import main

if __name__ == "__main__":
    sys.exit(main())
