"""`python -m toolscout ...`: the command line, for hosts that launch the gateway by interpreter path."""

import sys

from .cli import main

sys.exit(main())
