"""`python -m turnkit.cli`."""

from turnkit.cli import main

raise SystemExit(main())
