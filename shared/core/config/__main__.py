"""``python -m shared.core.config docs/operations.md``: rewrite that file's knob table."""

import sys

from shared.core.config.table import main

sys.exit(main(sys.argv[1:]))
