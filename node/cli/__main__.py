"""``python -m node.cli``: the same as the ``intellect-node`` binary."""

import sys

from node.cli.main import main

sys.exit(main())
