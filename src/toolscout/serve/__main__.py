"""`python -m toolscout.serve DIR [...]`: the same as `toolscout serve DIR [...]`."""

import sys

from .cli import main

sys.exit(main())
