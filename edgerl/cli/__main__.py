"""``python -m edgerl.cli``: the same as the ``edgerl`` command."""

import sys

from edgerl.cli import main

sys.exit(main())
