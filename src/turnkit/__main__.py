"""`python -m turnkit`: the `turnkit` command line."""

from turnkit.cli import main

raise SystemExit(main())
