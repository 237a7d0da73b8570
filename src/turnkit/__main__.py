"""`python -m turnkit`: the `turnkit` command line, started as the installed script starts it.

Ctrl-C while it loads ends it with status 130 and no traceback, as `turnkit` does.
"""

from _turnkit_cli import main

raise SystemExit(main())
