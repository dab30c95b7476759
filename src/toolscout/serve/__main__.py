"""`python -m toolscout.serve DIR [...]`: the same as `toolscout serve DIR [...]`."""

import sys

from ..cli.serve import main

sys.exit(main())
