"""``python -m dspk.linalg.winners``: this machine's classes, a table, an export."""

import sys

from . import main

sys.exit(main())
