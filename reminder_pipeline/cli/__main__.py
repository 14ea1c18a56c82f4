"""``python -m reminder_pipeline.cli``: the same as the ``reminder-pipeline`` script."""

import sys

from . import main

sys.exit(main())
