"""python -m fastln.serve.loadtest: the load generator's command line."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
