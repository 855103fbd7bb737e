"""``python -m services.cli``: the ``tessera`` command."""

import sys

from services.cli import main

sys.exit(main())
