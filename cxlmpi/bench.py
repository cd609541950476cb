"""``python -m cxlmpi.bench``: stock MPI vs cxlmpi, collective by collective.

The command keeps its name; the tool is :mod:`cxlmpi.tools.bench`.
"""

import sys

from cxlmpi.tools.bench import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
