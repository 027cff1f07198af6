"""``python -m agentkv`` is the same as the ``agentkv`` command."""

from agentkv.cli import main

raise SystemExit(main())
