"""``python -m ggmlpy``: see :mod:`ggmlpy.cli`."""

from .cli import main

raise SystemExit(main())
