"""``python -m batchctl``: the same CLI as the ``batchctl`` console script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
