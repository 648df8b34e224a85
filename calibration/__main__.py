"""``python -m calibration``: the calibration command line (see ``calibration.cli``)."""

import sys

from calibration.cli import main

sys.exit(main())
