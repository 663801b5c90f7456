"""python -m fastln.serve: the server's command line (fastln-serve)."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
