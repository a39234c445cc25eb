"""python -m awq_fast_dequant.bench: the same command as `python -m awq_fast_dequant bench`."""

import sys

from . import main

sys.exit(main())
