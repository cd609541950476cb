"""``python -m cxlmpi.tune``: where the pool beats stock MPI here, as a CXLMPI_TUNING file.

The command keeps its name; the tool is :mod:`cxlmpi.tools.tune`.
"""

import sys

from cxlmpi.tools.tune import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
