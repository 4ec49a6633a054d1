"""``python -m agent`` is the ``zonemeter`` command."""

import sys

from agent.cli import main

sys.exit(main())
