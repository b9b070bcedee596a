"""``python -m ggmlpy``: see :mod:`ggmlpy.cli`."""

from ggmlpy.cli import main

raise SystemExit(main())
