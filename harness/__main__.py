"""`python -m harness ...` is `loop-harness ...`."""

import sys

from ._cli import main

sys.exit(main())
