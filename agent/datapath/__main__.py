"""``python -m agent.datapath``: the debug command of :mod:`agent.datapath.debug`."""

import sys

from agent.datapath.debug import main

sys.exit(main())
