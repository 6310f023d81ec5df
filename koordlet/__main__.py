"""``python -m koordlet``: the same as the ``koordlet`` console script."""

import sys

from koordlet.cli import main

sys.exit(main())
