"""``python -m dspk``: the ``dspk`` command, for scripts, notebooks and cluster jobs that have
the package but not its console script on PATH."""

from .cli import main

raise SystemExit(main())
